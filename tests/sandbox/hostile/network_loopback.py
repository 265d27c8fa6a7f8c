"""Attack: reach the network: TCP to a port listening on the host's 127.0.0.1, UDP, a netlink socket."""
import socket


def main(ctx):
    out = {}
    for name, make, addr in (("tcp", lambda: socket.create_connection(("127.0.0.1", ctx["port"]), timeout=2), None),
                             ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM), ("127.0.0.1", ctx["port"])),
                             ("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0), None),
                             ("inet6", lambda: socket.create_connection(("::1", ctx["port"]), timeout=2), None)):
        try:
            s = make()
            if addr:
                s.sendto(b"exfiltrated", addr)
            out[name] = "connected"
            s.close()
        except OSError as e:
            out[name] = type(e).__name__
    return out
