"""Each model's loss on text the base writes itself: a forgetting measure that does not share the knowledge's kind.

The report's held-out loss reads the experiment's general text; in the sample world that text is the world's own
(its background people), so a route that learns the world lowers it while it forgets what the base knew of the real
one (the capitals show it). Here every model reads `--rows` texts of `--tokens` tokens that the untrained base
samples from its start token (temperature 1, nucleus 0.95, as `nkb_model.own_text` samples them, at a seed of its
own: not the texts `own_text_weight` trains on, which use the inject seed):

    python -m bench.own_text_loss --home .nkb base+nkb seed1 [--rows 128] [--seed 1234] [--routed]

`--routed` also gives each model's loss routed as the report's `routed` row is (`stages.report_routing`): the slots
read the texts whose best BM25 match in the knowledge's index (a long text's best stretch) reaches the lowest train
question's, the base (the slots unmounted: exactly the base) the others. Prints JSON (each model's mean next-token
loss and its change against the base's; with `--routed`, how many texts went to the slots) and records it as
`metrics` rows in `bench/results/own_text_loss`.
"""

from __future__ import annotations

import json
import sys


def main(argv=None) -> int:
    from bench import model_bench_parser, warehouse_models
    parser = model_bench_parser(__doc__, "bench/results/own_text_loss")
    parser.add_argument("--rows", type=int, default=128, help="how many texts the base writes")
    parser.add_argument("--tokens", type=int, default=64, help="how long each text is, in tokens")
    parser.add_argument("--seed", type=int, default=1234, help="the sampling seed (not the inject seed's texts)")
    parser.add_argument("--routed", action="store_true",
                        help="also each model routed by the knowledge's index, as the report's routed row")
    args = parser.parse_args(argv)

    import numpy as np

    from nkb_model.causal import start_ids
    from nkb_model.checkpoint import load_model
    from nkb_model.checks import heldout_row_losses
    from nkb_model.own_text import sample_own_text
    from nkb_model.train import choose_device
    from warehouse import Warehouse, run_stage

    wh, folders = warehouse_models(parser, args.home, ["base", *args.models])
    device = choose_device("auto", args.precision)
    base, tokenizer, _ = load_model(folders["base"])
    base.to(device.device)
    written = sample_own_text(base, tokenizer, args.rows, args.tokens, args.seed, device).numpy()
    start = start_ids(tokenizer)  # the context the texts were written after
    rows = np.concatenate([np.tile(start, (len(written), 1)).astype(written.dtype), written], axis=1)
    per_row = {"base": heldout_row_losses(base, tokenizer, rows, device)}
    if args.routed:
        from stages.report_routing import open_router, routed_loss
        try:
            with open_router(wh) as router:
                to_slots = router(tokenizer.batch_decode(written, skip_special_tokens=True))
        except ValueError as exc:
            parser.error(f"{args.home}: {exc}")
    routed = {}
    for name in args.models:
        model, _, _ = load_model(folders[name])
        per_row[name] = heldout_row_losses(model.to(device.device), tokenizer, rows, device)
        if args.routed:
            routed[name] = routed_loss(to_slots, per_row[name], per_row["base"])
    losses = {name: row_losses.mean() for name, row_losses in per_row.items()}

    def figures(loss: float) -> dict:
        return {"loss": round(loss, 4), "change_pct": round(100 * (loss / losses["base"] - 1), 2)}
    result = {name: figures(loss) | ({"routed": figures(routed[name])} if name in routed else {})
              for name, loss in losses.items()}

    def body(run):
        for name, row in result.items():
            run.metric(f"bench.own_text_loss.{name}", row["loss"])
            if "routed" in row:
                run.metric(f"bench.own_text_loss.{name}.routed", row["routed"]["loss"])
    run_stage(Warehouse(args.results), "bench-own-text-loss", vars(args), "bench", body, force=True)
    sent = {"to_slots": f"{int(to_slots.sum())} of {len(to_slots)}"} if args.routed else {}
    print(json.dumps({"rows": args.rows, "tokens": args.tokens, "seed": args.seed, **sent, "models": result},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
