"""Image files named by input records, checked before anything reads them further or sends
them anywhere.

A problems file's ``images`` are paths the policy server will receive as data URLs, with
the API key beside them: a path such as ``../../secret.txt`` or ``/etc/hostname`` would
otherwise send that file. So a path must resolve, symlinks followed, inside one folder
(the problems file's, or the one the user names), and the file must decode as an image
of an accepted format within a size and a pixel cap; Pillow's decompression-bomb warning
counts as a refusal, not a warning.

Failures raise ``ImageRefused`` with what is wrong and the fix; callers add where the path
came from (file, line, field).
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

MAX_IMAGE_BYTES = 20 * 2**20
"""A file larger than this is refused (OpenAI's own limit on one image is 20 MB)."""

MAX_IMAGE_PIXELS = 36_000_000
"""Width x height at most (6000 x 6000); well below Pillow's own bomb threshold."""

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
"""What OpenAI-compatible servers take; other formats (EPS runs Ghostscript) are not opened."""


_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


class ImageRefused(ValueError):
    """An image path or file that may not be used: ``str(e)`` says why and the fix
    (``decode_image``'s: what Pillow found, with ``reason`` and ``size``)."""

    def __init__(self, message: str, reason: str = "", size: tuple[int, int] | None = None):
        super().__init__(message)
        self.reason, self.size = reason, size


def resolve_image(path: str, root) -> str:
    """``path`` (relative ones against ``root``) as a real path that lies inside ``root``
    after symlinks on both sides are resolved."""
    base = Path(root).resolve()
    p = Path(path)
    real = (p if p.is_absolute() else base / p).resolve()
    if not real.is_relative_to(base):
        raise ImageRefused(
            f"{path!r} resolves to {str(real)!r}, outside {str(base)!r}; fix: keep images inside that folder "
            "(symlinks out of it count as outside) or name the folder that holds them with --image-root DIR"
        )
    if not real.is_file():
        raise ImageRefused(
            f"no such file {path!r} (looked for {str(real)!r}); fix: paths are relative to {str(base)!r}"
        )
    return str(real)


def decode_image(data: bytes, max_pixels: int, formats=FORMATS):
    """``data`` decoded with Pillow (pixels loaded), as one of ``formats`` (None: any Pillow
    reads). Its size is read from the header and checked against ``max_pixels`` before the
    pixels are decoded (a few KB of PNG can hold hundreds of MB), and the decompression-bomb
    warning counts as a refusal. Raises ``ImageRefused`` with ``reason`` ``pixels`` (and
    ``size``), ``bomb`` or ``unreadable``, for the caller to word; its detail never carries an
    object's repr (Pillow's can hold a memory address)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=formats)
            if im.size[0] * im.size[1] > max_pixels:
                raise ImageRefused("too many pixels", reason="pixels", size=im.size)
            im.load()  # decodes the pixels: a truncated or corrupt image fails here, not later
            return im
    except ImageRefused:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ImageRefused(str(e), reason="bomb") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as e:  # Pillow's decoders raise these on bad data
        raise ImageRefused(_ADDRESS.sub("the data", str(e)) or type(e).__name__, reason="unreadable") from None


def read_image(path: str) -> tuple[str, bytes]:
    """(MIME type, bytes) of an image file, after decoding it whole with Pillow: the bytes
    returned are the bytes checked, so what is sent is what was checked."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as e:
        raise ImageRefused(f"cannot read {path!r} ({e.strerror or e}); fix: give a readable image file") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused(
            f"{path!r} is larger than {MAX_IMAGE_BYTES} bytes; fix: scale the image down or re-encode it"
        )
    try:
        im = decode_image(data, MAX_IMAGE_PIXELS)
    except ImageRefused as e:
        if e.reason == "pixels":
            w, h = e.size
            msg = f"{path!r} is {w} x {h} pixels, over the cap of {MAX_IMAGE_PIXELS}; fix: scale the image down"
        elif e.reason == "bomb":
            msg = f"{path!r} is a decompression bomb ({e}); fix: give an ordinary image"
        else:
            msg = f"{path!r} is not an image Pillow can decode as {', '.join(FORMATS)} ({e}); fix: give an image file"
        raise ImageRefused(msg) from None
    with im:
        return Image.MIME[im.format], data
