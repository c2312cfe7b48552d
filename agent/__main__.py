from agent.app.cli import entry

entry()
