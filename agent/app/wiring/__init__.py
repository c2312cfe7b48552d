"""The agent wired by feature: each module builds one feature's parts from ``Settings``, or nothing.

``agent.app.assembly`` lists them in order; none of these modules imports another's feature."""
