"""A progress bar over jobs being waited on: tqdm's when it is installed, else a line of text
on stderr redrawn in place."""

import sys


class _TextBar:
    def __init__(self, total, desc, stream):
        self.total, self.n, self.desc, self.stream = total, 0, desc, stream
        self._draw()

    def _draw(self):
        width = 30
        filled = width * self.n // self.total if self.total else width
        self.stream.write(f"\r{self.desc}: [{'#' * filled}{'.' * (width - filled)}] "
                          f"{self.n}/{self.total}")
        self.stream.flush()

    def update(self, n=1):
        self.n += n
        self._draw()

    def close(self):
        self.stream.write("\n")
        self.stream.flush()


def progress_bar(total, desc="jobs", stream=None):
    """A bar with update(n) and close(): tqdm when importable, else plain text."""
    stream = stream or sys.stderr
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextBar(total, desc, stream)
    return tqdm(total=total, desc=desc, unit="job", file=stream)
