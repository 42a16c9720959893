"""Request processors of the broker, one module per concern (docs/protocol.md §5).

Each module exposes ``register(table: ProcessorTable, broker: BrokerController) -> None``;
`BrokerController.build_processor_table()` calls them all.
"""
