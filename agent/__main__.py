from agent.app.entry import entry

entry()
