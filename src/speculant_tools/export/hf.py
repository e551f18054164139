"""Write a package's weights back out as a Hugging Face checkpoint.

    export_hf(package_root, out_dir)
    # out_dir/config.json          LlamaForCausalLM (tied embeddings)
    # out_dir/model.safetensors    the target's weights under their HF names
    # out_dir/drafter.safetensors  the chained drafter's ``drafter.*`` weights (pairs only;
    #                              EAGLE-3's seed projection among them, its streams in the
    #                              file's ``seed_feature_layers`` metadata)
    # out_dir/tokenizer.json       the package's tokenizer
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from speculant_tools.export.config import ExportError
from speculant_tools.export.package import read_settings, read_weights


def export_hf(package_root: str | Path, out_dir: str | Path) -> Path:
    """The checkpoint of a package written by :mod:`speculant_tools.export`, in the package dtype.
    ``transformers.LlamaForCausalLM.from_pretrained(out_dir)`` loads it. An int4 drafter
    (``--quantize-drafter``) has no float weights: the target is written alone."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ExportError("export_hf writes model.safetensors and needs the safetensors "
                          "package", remedy="pip install safetensors") from None
    settings = read_settings(package_root)
    config, target, drafter = read_weights(package_root, skip_int4_drafter=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_config = config.to_hf(settings.dtype, eos_token_id=settings.eos_id)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(target, str(out / "model.safetensors"), metadata={"format": "pt"})
    if drafter is not None:
        layers = config.seed_feature_layers
        save_file(drafter, str(out / "drafter.safetensors"),
                  metadata={"format": "pt", "scale": repr(settings.scale),
                            "max_proposal_width": str(settings.max_proposal_width),
                            **({"seed_feature_layers": json.dumps(list(layers))}
                               if layers is not None else {})})
    if settings.tokenizer.is_file():
        shutil.copyfile(settings.tokenizer, out / "tokenizer.json")
    return out
