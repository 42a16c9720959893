"""Shared model and codecs: messages, stored records, properties, names, ids, tag hashes."""
