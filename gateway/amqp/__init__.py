"""AMQP 0-9-1 front end (issue 13). So far: the sans-IO codec (`codec`, `methods`, `fields`,
`properties`), the sans-IO server connection (`connection`) and a thin trio server
(`server`). See docs/amqp.md."""
