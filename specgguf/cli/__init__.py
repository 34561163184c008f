"""The terminal: app (the Typer app; errors become one line here), commands (run, chat, serve) and
tool_commands (bench, pull, pairs, check, worker), options (the shared options), run, chat (the REPL),
chat_session, chat_report, ctrl_c (Ctrl-C during an answer), check, pairs, pull, worker, render."""
