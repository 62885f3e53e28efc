"""kernelloop: build, test and time GPU kernels submitted by agents, honestly; and an agent loop around it.

The packages, from the ground up: `kernelloop.tools` (the phases, the sandbox, the workers),
`kernelloop.contract` (every HTTP body), `kernelloop.storage` (the tables and the queue),
`kernelloop.server` (the HTTP service), `kernelloop.agent` (the loop that proposes kernels), and
`kernelloop.cli` on top, the command line. Imports only go down that list.
"""
