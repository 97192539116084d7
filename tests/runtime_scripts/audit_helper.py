"""A helper module of the kind training scripts import: it prints, and it writes a file."""


def log(message):
    print(message)


def write_summary(path, text):
    with open(path, "w") as f:  # helper write
        f.write(text)
