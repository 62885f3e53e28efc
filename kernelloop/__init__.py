"""kernelloop: build, test and time GPU kernels submitted by agents, honestly; and an agent loop around it.

The packages, from the ground up: `kernelloop.tools` (the phases, the sandbox, the workers),
`kernelloop.contract` (every HTTP body), `kernelloop.storage` (the tables and the queue), then side by side
`kernelloop.server` (the HTTP service) and `kernelloop.agent` (the loop that proposes kernels, a client of the
service), and `kernelloop.cli` on top, the command line, which composes them. Imports only go down, never
between the two siblings; tests/test_imports.py holds the table of allowed edges and checks every import.
"""
