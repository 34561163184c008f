"""The terminal: app (the commands; errors become one line here), options, run, chat (the REPL),
chat_session, chat_report, check, pairs, pull, worker, render."""
