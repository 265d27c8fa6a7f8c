"""Attack: reach the network: TCP to a port listening on the host's 127.0.0.1, UDP, a netlink socket."""
import socket


def main(ctx):
    out = {}
    port = ctx["port"]
    for name, make, addr in (("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=2), None),
                             ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM), ("127.0.0.1", port)),
                             ("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0), None),
                             ("inet6", lambda: socket.create_connection(("::1", port), timeout=2), None)):
        try:
            s = make()
            if addr:
                s.sendto(b"exfiltrated", addr)
            out[name] = "connected"
            s.close()
        except OSError as e:
            out[name] = type(e).__name__
    return out
