"""Record a quickstart's CTranslate2 export: int8 against float32 on the test verses.

    aiayn quickstart --out runs/q                                   # trains and scores
    python -m benchmarks.record_export runs/q --note "how it ran"   # results/export.json
    python -m benchmarks.record_export runs/q --limit 20 --name export-quick   # a check

For a finished `aiayn quickstart --out` directory it exports the weights the quickstart
scored (results.json's "weights") with `aiayn.io.export.export_ctranslate2`, once per
quantization, and translates the test split with CTranslate2 at the quickstart's
beam and alpha (CTranslate2's length penalty is |Y|^alpha, not aiayn's GNMT form),
pad and bos suppressed. It records, per quantization, the test BLEU and chrF against
the references, the BLEU of its output scored against float32's (how far the
quantization moves the translations), the share of verses translated exactly as
float32 translates them, and the seconds taken (meaningful only on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aiayn.data.corpus import PreparedCorpus
from aiayn.data.tokenizer import TOKENIZER_FILE
from aiayn.io.export import GenerationSettings, export_ctranslate2
from aiayn.training.evaluate import score
from benchmarks import common

QUANTIZATIONS = ("float32", "int8_float32", "int8")


def translate(directory: Path, sources, beam: int, alpha: float, threads: int):
    """CTranslate2's translations of `sources` (text), and the seconds they took."""
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(directory / TOKENIZER_FILE))
    compute = "int8" if directory.name.startswith("int8") else "float32"
    translator = ctranslate2.Translator(str(directory), compute_type=compute, intra_threads=threads)
    pieces = [[*sp.encode(text, out_type=str), sp.id_to_piece(sp.eos_id())] for text in sources]
    never = [[sp.id_to_piece(sp.pad_id())], [sp.id_to_piece(sp.bos_id())]]
    started = time.perf_counter()
    results = translator.translate_batch(
        pieces,
        beam_size=beam,
        length_penalty=alpha,
        max_decoding_length=min(256, translator_max_len(directory) - 1),
        suppress_sequences=never,
        max_batch_size=32,
    )
    seconds = time.perf_counter() - started
    return [sp.decode_pieces(r.hypotheses[0]) for r in results], seconds


def translator_max_len(directory: Path) -> int:
    """The exported model's position count (config.json of its Hugging Face export is not
    kept; the model card states it, and generation_config.json's max_length is it)."""
    generation = json.loads((directory / "generation_config.json").read_text())
    return int(generation["max_length"])


def record(out: Path, limit: int | None, threads: int) -> dict[str, Any]:
    results_file = out / "results.json"
    if not results_file.is_file():
        raise SystemExit(f"{out}: no results.json (not a finished `aiayn quickstart --out`)")
    trained = json.loads(results_file.read_text())
    weights = Path(trained["weights"])
    beam, alpha = int(trained["beam"]), float(trained["alpha"])
    pairs = PreparedCorpus.load(out / "data").read("test")[:limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    rows, outputs = [], {}
    with tempfile.TemporaryDirectory(prefix="record-export-") as tmp:
        for quantization in QUANTIZATIONS:
            directory = Path(tmp) / quantization
            export_ctranslate2(
                weights,
                directory,
                quantization=None if quantization == "float32" else quantization,
                spm=out / "run" / TOKENIZER_FILE,
                generation=GenerationSettings(beam=beam, length_penalty=alpha),
            )
            hypotheses, seconds = translate(directory, sources, beam, alpha, threads)
            outputs[quantization] = hypotheses
            scores = score(hypotheses, references)
            against_fp32 = score(hypotheses, outputs["float32"])
            same = sum(a == b for a, b in zip(hypotheses, outputs["float32"], strict=True))
            rows.append(
                {
                    "quantization": quantization,
                    "bleu": round(scores.bleu, 2),
                    "chrf": round(scores.chrf, 2),
                    "bleu_against_float32": round(against_fp32.bleu, 2),
                    "same_as_float32": round(same / len(sources), 4),
                    "seconds": round(seconds, 2),
                }
            )
            print(f"{quantization}: test BLEU {scores.bleu:.2f}, against float32 "
                  f"{against_fp32.bleu:.2f}, {same}/{len(sources)} the same", flush=True)  # fmt: skip
    return {
        "run": str(out),
        "weights": str(weights),
        "quickstart_bleu": trained.get("bleu"),
        "beam": beam,
        "alpha": alpha,
        "sentences": len(sources),
        "bleu_signature": scores.bleu_signature,
        "quantizations": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an `aiayn quickstart --out` directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="export", help="results file name")
    parser.add_argument("--limit", type=int, help="the first N test pairs only (a quick check)")
    parser.add_argument("--note", default="", help="how the run was trained, for the report")
    args = parser.parse_args()
    common.set_threads(args.threads)
    payload = record(args.run, args.limit, args.threads)
    path = common.write_json(
        args.name, {"args": {**vars(args), "run": str(args.run)}, "split": "test", **payload}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
