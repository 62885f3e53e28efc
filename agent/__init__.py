"""The agent: a loop that proposes kernels, evaluates them through the kernelloop service, and keeps the best.

`kernelloop agent run` (kernelloop.cli.agent) drives `agent.loop` with one of the proposers in `agent.proposers`
(llm, search, replay), talking to the service over HTTP (`agent.service_client`): the URL it is handed, of a
service the command line embeds on a loopback port when no --server is given (`kernelloop.cli.embedded`). The
agent never imports the service (tests/test_imports.py holds every package to its edges).
"""
