"""Where a model comes from: an existing local path, else a Hugging Face repo id to download.
mlx-lm sends every missing path to the Hub, so a mistyped local folder read as a network problem
(``HFValidationError``, ``check your internet connection``); here it is a FileNotFoundError."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

# Hugging Face repo ids as "org/name" of letters, digits, '-', '_', '.', no leading '.'
# ('./x', '../x', '~/x', '/x' and anything with another '/' are local paths).
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def looks_like_repo_id(text: str) -> bool:
    return REPO_ID.fullmatch(text) is not None and ".." not in text


def resolve(path_or_hf_repo, where: str, revision: Optional[str] = None, download: bool = True) -> Path:
    """The local folder of ``path_or_hf_repo``: the path itself when it exists, else the download of a
    repo id ``org/name`` (mlx-lm's ``_download``). A missing path that is no repo id is a
    FileNotFoundError naming it (any missing path when not ``download``); a failed download says that it was neither local nor downloadable."""
    text = str(path_or_hf_repo)
    path = Path(text).expanduser()
    if path.exists():
        return path
    if not download:
        raise FileNotFoundError(f"[{where}] {text!r}: no such file.")
    if not looks_like_repo_id(text):
        raise FileNotFoundError(f"[{where}] {text!r}: no such file or folder (and not a Hugging Face repo id "
                                "'org/name').")
    from mlx_lm.utils import _download

    try:
        return _download(text, revision=revision)
    except Exception as e:  # huggingface_hub's errors: offline, unknown repo, gated repo
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"[{where}] {text!r} is not a local folder, and downloading it from the "
                                f"Hugging Face Hub failed ({type(e).__name__}: {first}).") from e
