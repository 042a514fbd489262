"""Model stages (GPU pool): they read the warehouse, train or evaluate, and write models and results back.

The device and precision are chosen once here, at each stage's entry, and passed down.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from flows.configs import BaseModelConfig
from flows.stages import corpus_lineage
from warehouse import StagedRun, StageResult, Warehouse, fingerprint, run_stage

MODEL_INFO = "nkb-model.json"


def _texts(wh: Warehouse, corpus: str) -> list[str]:
    texts = []
    for batch in wh.scan("documents", ["text"], filter=pc.field("corpus") == corpus):
        texts += batch.column("text").to_pylist()
    if not texts:
        raise ValueError(f"corpus {corpus!r} has no documents")
    return texts


def model_dir(wh: Warehouse, name: str, fp: str) -> Path:
    return wh.files_dir / "models" / f"{name}-{fp[:12]}"


def pretrain_base_model(wh: Warehouse, config: BaseModelConfig, force: bool = False) -> StageResult:
    """Tokenizer + span-corruption pretraining; saves a Hugging Face directory under `files/models/`."""
    from nkb_model import base_model
    from nkb_model.train import TrainConfig, choose_device, train
    corpora = sorted(set(config.tokenizer_corpora) | {config.pretrain_corpus})
    params = config.model_dump(exclude={"device", "micro_batch_size"})
    fp = fingerprint("base-model", params, [f"{c}:{corpus_lineage(wh, c)}" for c in corpora])
    target = model_dir(wh, config.name, fp)
    device = choose_device(config.device)

    def body(run: StagedRun) -> dict:
        started = time.perf_counter()
        run.run.device = device.name
        tokenizer = base_model.train_tokenizer(
            (t for c in config.tokenizer_corpora for t in _texts(wh, c)), config.vocab_size)
        texts = _texts(wh, config.pretrain_corpus)
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        rows = base_model.pack(ids, config.seq_len, tokenizer.eos_token_id)
        order = np.random.default_rng(config.seed).permutation(len(rows))
        n_held = int(len(rows) * config.held_out_share)
        held_out, train_rows = rows[order[:n_held]], rows[order[n_held:]]
        model = base_model.new_t5(tokenizer, config.size, config.dropout, config.seed).to(device.device)
        model.train()
        batches = base_model.SpanCorruptionBatches(train_rows, tokenizer, config.batch_size, config.seed)
        train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size,
                                   micro_batch_size=config.micro_batch_size, lr=config.lr,
                                   warmup_steps=config.warmup_steps, optimizer=config.optimizer)
        # The checkpoint folder is named by the inputs fingerprint, so an interrupted run resumes.
        work = target.parent / f".train-{target.name}"
        losses = train(model, batches, train_config, device, work, desc=f"pretrain {config.name}")
        for step, loss in losses:
            run.metric("pretrain_loss", loss, dataset=config.pretrain_corpus, split="train", step=step)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-model-", dir=target.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        np.save(tmp / "held_out.npy", held_out)  # for the no-forgetting check
        n_params = sum(p.numel() for p in model.parameters())
        info = {"name": config.name, "size": config.size, "params": n_params, "vocab": len(tokenizer),
                "built_by": run.run_id, "final_loss": losses[-1][1]}
        (tmp / MODEL_INFO).write_text(json.dumps(info, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        shutil.rmtree(work, ignore_errors=True)
        run.run.checkpoint = str(target)
        run.run.outputs["model_params"] = n_params
        run.metric("params_total", n_params)
        seconds = time.perf_counter() - started
        return {"model": str(target), "params": n_params, "final_loss": round(losses[-1][1], 4),
                "sequences": len(train_rows), "seconds": seconds, "device": device.name}

    target.parent.mkdir(parents=True, exist_ok=True)
    return run_stage(wh, "base-model", config.model_dump(), fp, body, force=force, device=device.name,
                     still_valid=lambda run: (Path(run.checkpoint or "") / MODEL_INFO).exists())
