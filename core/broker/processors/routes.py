"""Request routes declared where the handler is: `@handles(code)` on a processor method,
`register_handlers(table, processor)` in the module's `register`."""

from __future__ import annotations


def handles(code: int, *, inline: bool = True):
    """Mark a processor method as the handler of request `code` (`register_handlers`
    routes it; `inline` as in `ProcessorTable.register`)."""

    def mark(method):
        method.request_code = (int(code), inline)
        return method

    return mark


def register_handlers(table, proc) -> None:
    """Route every method of `proc` marked with `handles` in `table`."""
    for name, member in vars(type(proc)).items():
        marked = getattr(member, "request_code", None)
        if marked is not None:
            table.register(marked[0], getattr(proc, name), inline=marked[1])
