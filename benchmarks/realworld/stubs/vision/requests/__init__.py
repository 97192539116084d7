"""A stand-in for requests with no network: ``get`` of the Cora archive returns a synthetic
cora.tgz (1701 papers, 32 features, 7 classes); any other URL raises ConnectionError."""
from __future__ import annotations

import io
import random
import tarfile


class ConnectionError(OSError):
    pass


def _cora() -> bytes:
    rng = random.Random(0)
    n, labels = 1701, [f"C{i}" for i in range(7)]
    content = "".join(
        f"{1000 + i}\t" + "\t".join(str(rng.randint(0, 1)) for _ in range(32)) + f"\t{labels[i % 7]}\n"
        for i in range(n))
    cites = "".join(f"{1000 + rng.randrange(n)}\t{1000 + rng.randrange(n)}\n" for _ in range(3 * n))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("cora/cora.content", content), ("cora/cora.cites", cites)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Response:
    def __init__(self, data: bytes):
        self.raw, self.content, self.status_code = io.BytesIO(data), data, 200

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def raise_for_status(self):
        pass

    def iter_content(self, chunk_size=1024):
        yield self.content


def get(url, stream=False, **kwargs):
    if "cora" in url:
        return Response(_cora())
    raise ConnectionError(f"no network here (stub): {url}")
