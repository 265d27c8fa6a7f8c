"""Attack: allocate and touch memory until something gives."""


def main(ctx):
    hog = []
    while True:
        hog.append(bytearray(64 << 20))
