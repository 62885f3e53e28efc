# The network: TCP and UDP to the host, a unix socket by path, an abstract unix socket, the internet.
import socket


def tcp():
    socket.create_connection(("127.0.0.1", __PORT__), timeout=3).close()
    return "connected"


def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect(("127.0.0.1", __PORT__))  # connected: the port's refusal (ICMP) comes back as an error
        s.send(b"hello")
        return s.recv(16)


def unix(address):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(address)
        return "connected"


def outside():
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    return "connected"


reached(f"network interfaces {sorted(name for _, name in socket.if_nameindex())}")
attempt("tcp_loopback", tcp)
attempt("udp_loopback", udp)
attempt("unix_socket", lambda: unix("__UNIX_SOCKET__"))
attempt("abstract_socket", lambda: unix("\0__ABSTRACT__"))
attempt("internet", outside)
report()
