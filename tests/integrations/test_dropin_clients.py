"""posformers as a drop-in, under the clients users run it in: transformers-format DeBERTa-v3, DeBERTa and RoFormer
checkpoints (tiny, random, the bert-base-uncased vocabulary) loaded through transformers' Auto classes while
`posformers.enabled()`, then used as each client's users use them: transformers pipelines, `Trainer` in a user's
script, sentence-transformers (SentenceTransformer and CrossEncoder, inference and training) and PEFT LoRA.

Every number is checked against the same client on the same checkpoint WITHOUT posformers: one child process, which
cannot import posformers, runs the same client functions (this file's `client_*` functions, their source sent to it)
and hands back what they gave. The user's Trainer script runs as a script in a child of its own, with
`posformers.enable()` at its top; the reference child runs it without, and loads the folder the posformers run saved.
`posformers.optimize` on transformers models built directly is checked in-process. Real text: SST-2 and MRPC.

Per-token outputs are compared at real tokens only: posformers leaves zeros at padded positions, transformers
whatever its computation gives there.
"""

from __future__ import annotations

import csv
import inspect
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import transformers
from helpers import python_env, run_python
from helpers.data import DATA_DIR
from helpers.modeling import TINY_FIELDS
from safetensors.torch import load_file

import posformers

TOKENIZER = transformers.BertTokenizer.from_pretrained(DATA_DIR / "vocab" / "bert-base-uncased")
TOLERANCE = 1e-5
DROPIN = "posformers.dropin"


def sst2(split: str, count: int) -> list[tuple[str, int]]:
    """The first `count` (sentence, label) rows of SST-2 `split`."""
    lines = (DATA_DIR / "glue" / "sst2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1 : count + 1]
    return [(text.strip(), int(label)) for text, label in (line.rsplit("\t", 1) for line in lines)]


def mrpc(count: int) -> list[tuple[str, str, int]]:
    """The first `count` (sentence, sentence, is-paraphrase) rows of MRPC train."""
    with open(DATA_DIR / "glue" / "mrpc" / "train.tsv", encoding="utf-8-sig", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(row["#1 String"], row["#2 String"], int(row["Quality"])) for row in rows[:count]]


SENTENCES = [text for text, _ in sst2("dev", 8)]
MASKED = [" ".join([*s.split()[:2], TOKENIZER.mask_token, *s.split()[3:]]) for s in SENTENCES[:4]]
NLI_LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}

# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints: transformers' own classes and format, saved with the tokenizer
# ---------------------------------------------------------------------------------------------------------------------

DEBERTA_V3 = dict(  # DeBERTa-v3's attention: log buckets, p2c + c2p with shared keys, no absolute positions
    max_position_embeddings=512,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=32,
    max_relative_positions=-1,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    position_biased_input=False,
    type_vocab_size=0,
)
DEBERTA_V1 = dict(  # deberta-base's
    max_position_embeddings=512,
    relative_attention=True,
    pos_att_type=["c2p", "p2c"],
    max_relative_positions=-1,
    position_biased_input=False,
    type_vocab_size=0,
)
ROFORMER = dict(max_position_embeddings=128)
# name: (config class, its fields, model class, head fields)
CHECKPOINTS = {
    "deberta-v3": ("DebertaV2Config", DEBERTA_V3, "DebertaV2Model", {}),
    "deberta-v3-sst2": (
        "DebertaV2Config",
        DEBERTA_V3,
        "DebertaV2ForSequenceClassification",
        dict(id2label={0: "negative", 1: "positive"}),
    ),
    "deberta-v3-nli": (
        "DebertaV2Config",
        DEBERTA_V3,
        "DebertaV2ForSequenceClassification",
        dict(id2label=NLI_LABELS, label2id={label: i for i, label in NLI_LABELS.items()}),
    ),
    "deberta-v3-rerank": ("DebertaV2Config", DEBERTA_V3, "DebertaV2ForSequenceClassification", dict(num_labels=1)),
    "deberta-v3-ner": ("DebertaV2Config", DEBERTA_V3, "DebertaV2ForTokenClassification", dict(num_labels=3)),
    "deberta-v3-mlm": ("DebertaV2Config", DEBERTA_V3, "DebertaV2ForMaskedLM", dict(legacy=False)),
    "deberta-v1-ner": ("DebertaConfig", DEBERTA_V1, "DebertaForTokenClassification", dict(num_labels=3)),
    "roformer-sst2": ("RoFormerConfig", ROFORMER, "RoFormerForSequenceClassification", {}),
    "roformer-mlm": ("RoFormerConfig", ROFORMER, "RoFormerForMaskedLM", {}),
}


def transformers_model(name: str):
    """Checkpoint `name` as transformers builds it (random, initializer_range 0.2 so that scores differ), in eval
    mode."""
    config_class, fields, model_class, head = CHECKPOINTS[name]
    fields = {**TINY_FIELDS, **fields, **head, "vocab_size": TOKENIZER.vocab_size, "initializer_range": 0.2}
    config = getattr(transformers, config_class)(**fields, pad_token_id=TOKENIZER.pad_token_id)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Every checkpoint saved by transformers with `save_pretrained`, tokenizer beside it: {name: folder}."""
    root = tmp_path_factory.mktemp("checkpoints")
    saved = {}
    for name in CHECKPOINTS:
        transformers_model(name).save_pretrained(root / name)
        TOKENIZER.save_pretrained(root / name)
        saved[name] = str(root / name)
    return saved


# ---------------------------------------------------------------------------------------------------------------------
# The clients, as users call them. The reference child runs these same functions (their source) without posformers;
# each imports what it uses, and returns plain values and tensors.
# ---------------------------------------------------------------------------------------------------------------------


def client_pipeline(case: dict, folder: str) -> dict:
    """`transformers.pipeline(task, model=folder)` on the case's inputs: the class that ran and the outputs."""
    import json

    import transformers

    pipe = transformers.pipeline(case["task"], model=folder, **case["init"])
    output = pipe(case["inputs"], **case["call"])
    plain = json.loads(json.dumps(output, default=lambda value: value.tolist()))  # numpy scalars and arrays
    return {"module": type(pipe.model).__module__, "encoder": type(pipe.model.base_model).__module__, "output": plain}


def client_sentence_transformer(folder: str, sentences: list[str], pairs: list[list[str]], output: str) -> dict:
    """SentenceTransformer(folder) on a plain transformers folder (Transformer + mean Pooling): embeddings; then one
    SentenceTransformerTrainer step with MultipleNegativesRankingLoss on paraphrase pairs: its loss, the weights."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(folder, device="cpu")
    module = type(model[0].model).__module__
    embeddings = model.encode(sentences, batch_size=4, convert_to_tensor=True)
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=output, per_device_train_batch_size=len(pairs), max_steps=1, learning_rate=1e-3, seed=0,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=MultipleNegativesRankingLoss(model)
    )
    trainer.train()
    return {
        "module": module,
        "embeddings": embeddings,
        "loss": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "weights": {key: value.clone() for key, value in model[0].model.state_dict().items()},
        "trained_embeddings": model.encode(sentences, batch_size=4, convert_to_tensor=True),
    }


def client_cross_encoder(folder: str, pairs: list[list[str]], labels: list[int], output: str) -> dict:
    """CrossEncoder(folder) on a one-label transformers classifier: `predict` on sentence pairs; then one
    CrossEncoderTrainer step with BinaryCrossEntropyLoss on the pairs' paraphrase labels: its loss, the weights."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    model = CrossEncoder(folder, device="cpu")
    module = type(model.model).__module__
    scores = torch.as_tensor(model.predict([tuple(pair) for pair in pairs], batch_size=4))
    dataset = Dataset.from_dict(
        {"sentence1": [a for a, _ in pairs], "sentence2": [b for _, b in pairs], "label": [float(x) for x in labels]}
    )
    args = CrossEncoderTrainingArguments(
        output_dir=output, per_device_train_batch_size=len(pairs), max_steps=1, learning_rate=1e-3, seed=0,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, loss=BinaryCrossEntropyLoss(model))
    trainer.train()
    return {
        "module": module,
        "scores": scores,
        "weights": {key: value.clone() for key, value in model.model.state_dict().items()},
        "trained_scores": torch.as_tensor(model.predict([tuple(pair) for pair in pairs], batch_size=4)),
        "loss": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    }


def client_peft(folder: str, sentences: list[str], labels: list[int]) -> dict:
    """PEFT LoRA (r=4 on query_proj/value_proj, SEQ_CLS; seeded) on AutoModelForSequenceClassification.from_pretrained:
    the adapters' initial weights, the logits (training mode, with autograd; and eval without), the loss and the
    gradients of the trainable parameters after one backward."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    module = type(model).__module__
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, target_modules=["query_proj", "value_proj"], task_type="SEQ_CLS", init_lora_weights=False
    )  # random B as well as A: the adapters change the logits and A gets gradients too
    model = get_peft_model(model, config)
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    model.train()
    output = model(**batch, labels=torch.tensor(labels))
    output.loss.backward()
    model.eval()
    with torch.no_grad():
        eval_logits = model(**batch).logits
    return {
        "module": module,
        "lora_init": {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k},
        "logits": output.logits.detach(),
        "eval_logits": eval_logits,
        "loss": output.loss.item(),
        "grads": {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad},
    }


CLIENTS = (client_pipeline, client_sentence_transformer, client_cross_encoder, client_peft)

# ---------------------------------------------------------------------------------------------------------------------
# The user's Trainer script
# ---------------------------------------------------------------------------------------------------------------------

TRAIN_SCRIPT = '''\
"""Fine-tune a sentiment classifier on SST-2 with transformers' Trainer."""

import json
import os
import sys

import datasets
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

model_dir, train_file, dev_file, output_dir, report = sys.argv[1:6]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSequenceClassification.from_pretrained(model_dir)


def read(path, count):
    rows = [line.rsplit("\\t", 1) for line in open(path, encoding="utf-8").read().splitlines()[1 : count + 1]]
    return {"sentence": [text.strip() for text, _ in rows], "label": [int(label) for _, label in rows]}


def tokenized(rows):
    dataset = datasets.Dataset.from_dict(rows)
    return dataset.map(lambda rows: tokenizer(rows["sentence"]), batched=True, remove_columns=["sentence"])


args = TrainingArguments(
    output_dir=output_dir,
    per_device_train_batch_size=8,
    per_device_eval_batch_size=8,
    max_steps=4,
    learning_rate=1e-3,
    logging_steps=1,
    eval_strategy="steps",
    eval_steps=2,
    seed=0,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    disable_tqdm=True,
)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=tokenized(read(train_file, 32)),
    eval_dataset=tokenized(read(dev_file, 8)),
    processing_class=tokenizer,
    data_collator=DataCollatorWithPadding(tokenizer),
)
trainer.train()
trainer.save_model()

model.eval()
batch = tokenizer(read(dev_file, 8)["sentence"], padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(**batch).logits
summary = {
    "class": f"{type(model).__module__}.{type(model).__name__}",
    "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    "eval_losses": [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry],
    "logits": logits.tolist(),
}
with open(report + ".tmp", "w") as file:
    json.dump(summary, file)
os.replace(report + ".tmp", report)
'''
ENABLE = "import posformers\n\nposformers.enable()\n\n"

# ---------------------------------------------------------------------------------------------------------------------
# The two children: the user's script with posformers, and the reference without
# ---------------------------------------------------------------------------------------------------------------------


def pipeline_case(task: str, model: str, inputs: list[str], init: dict | None = None, **call) -> dict:
    """`pipeline(task, model=<model's folder>, **init)(inputs, **call)`."""
    return dict(task=task, model=model, inputs=inputs, init=init or {}, call=call)


# Batched (so padded) everywhere; token-classification keeps every token (no "O" filtered out).
PIPELINE_CASES = {
    "text-classification/deberta-v3": pipeline_case(
        "text-classification", "deberta-v3-sst2", SENTENCES, top_k=None, batch_size=4
    ),
    "text-classification/roformer": pipeline_case(
        "text-classification", "roformer-sst2", SENTENCES, top_k=None, batch_size=4
    ),
    "zero-shot-classification/deberta-v3": pipeline_case(
        "zero-shot-classification",
        "deberta-v3-nli",
        SENTENCES[:3],
        candidate_labels=["positive", "negative", "about acting"],
        batch_size=2,
    ),
    "token-classification/deberta-v3": pipeline_case(
        "token-classification", "deberta-v3-ner", SENTENCES[:4], dict(ignore_labels=[]), batch_size=2
    ),
    "token-classification/deberta-v1": pipeline_case(
        "token-classification", "deberta-v1-ner", SENTENCES[:4], dict(ignore_labels=[]), batch_size=2
    ),
    "fill-mask/deberta-v3": pipeline_case("fill-mask", "deberta-v3-mlm", MASKED, top_k=5, batch_size=2),
    "fill-mask/roformer": pipeline_case("fill-mask", "roformer-mlm", MASKED, top_k=5, batch_size=2),
    "feature-extraction/deberta-v3": pipeline_case("feature-extraction", "deberta-v3", SENTENCES, batch_size=4),
    # the base model of a masked-LM checkpoint
    "feature-extraction/roformer": pipeline_case("feature-extraction", "roformer-mlm", SENTENCES, batch_size=4),
}
ST_PAIRS = [[a, b] for a, b, label in mrpc(24) if label == 1][:8]
CE_PAIRS = [[a, b] for a, b, _ in mrpc(8)]
CE_LABELS = [label for *_, label in mrpc(8)]
PEFT_ROWS = sst2("train", 16)

# Run without posformers: every client on every case, the user's script, then
# the folder the posformers run of the script saved, loaded back with transformers' Auto class.
REFERENCE = """
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

folders = ARGS["folders"]
result = {"pipelines": {}}
for name, case in ARGS["pipelines"].items():
    result["pipelines"][name] = client_pipeline(case, folders[case["model"]])
result["sentence_transformer"] = client_sentence_transformer(
    folders["deberta-v3"], ARGS["sentences"], ARGS["st_pairs"], ARGS["work"] + "/st"
)
result["cross_encoder"] = client_cross_encoder(
    folders["deberta-v3-rerank"], ARGS["ce_pairs"], ARGS["ce_labels"], ARGS["work"] + "/ce"
)
result["peft"] = client_peft(folders["deberta-v3-sst2"], *ARGS["peft"])

train = ARGS["train"]
sys.argv = [train["script"], *train["args"]]  # as `python train.py ...` runs it
exec(compile(Path(train["script"]).read_text(), train["script"], "exec"), {"__name__": "__main__"})

deadline = time.monotonic() + 600  # the posformers run of the script, running beside this process
while not Path(train["dropin_report"]).exists():
    if Path(train["dropin_report"] + ".failed").exists() or time.monotonic() > deadline:
        raise SystemExit("the posformers run of the training script did not finish")
    time.sleep(0.2)
model = AutoModelForSequenceClassification.from_pretrained(train["dropin_output"]).eval()
tokenizer = AutoTokenizer.from_pretrained(train["dropin_output"])
with torch.no_grad():
    logits = model(**tokenizer(ARGS["sentences"], padding=True, return_tensors="pt")).logits
result["dropin_reloaded"] = {"class": f"{type(model).__module__}.{type(model).__name__}", "logits": logits}

torch.save(result, ARGS["work"] + "/reference.pt")
imported = [name for name in sys.modules if name.split(".")[0] == "posformers"]
print(json.dumps({"posformers_found": POSFORMERS_FOUND, "posformers": imported}))
"""


class Children:
    """The user's Trainer script run with posformers, and the reference child, started together (they overlap each
    other and the tests' own work) and waited for when a test first needs what they give."""

    def __init__(self, folders: dict[str, str], work: Path):
        self.work = work
        sst2_files = [str(DATA_DIR / "glue" / "sst2" / f"{split}.tsv") for split in ("train", "dev")]
        train = {  # the script's arguments: model, train file, dev file, output folder, report
            "script": str(work / "train.py"),
            "args": [folders["deberta-v3-sst2"], *sst2_files, str(work / "plain"), str(work / "plain.json")],
            "dropin_output": str(work / "dropin"),
            "dropin_report": str(work / "dropin.json"),
        }
        (work / "train.py").write_text(TRAIN_SCRIPT)
        (work / "train_posformers.py").write_text(ENABLE + TRAIN_SCRIPT)
        dropin_command = [sys.executable, "-I", str(work / "train_posformers.py"), *train["args"][:3]]
        dropin_command += [train["dropin_output"], train["dropin_report"]]
        args = {
            "folders": folders,
            "pipelines": PIPELINE_CASES,
            "sentences": SENTENCES,
            "st_pairs": ST_PAIRS,
            "ce_pairs": CE_PAIRS,
            "ce_labels": CE_LABELS,
            "peft": [[text for text, _ in PEFT_ROWS], [label for _, label in PEFT_ROWS]],
            "train": train,
            "work": str(work),
        }
        code = "\n\n".join(inspect.getsource(client) for client in CLIENTS) + "\n" + REFERENCE
        env = python_env(work / "hf-home", OMP_NUM_THREADS="1")  # two cores, three processes
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._dropin = self._executor.submit(self._run_dropin_script, dropin_command, env, train["dropin_report"])
        self._reference = self._executor.submit(
            run_python, code, args, env=env, cwd=work, without_posformers=True, timeout=900
        )
        self._reference_result = None

    def _run_dropin_script(self, command: list[str], env: dict, report: str) -> dict:
        result = subprocess.run(command, env=env, cwd=self.work, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            Path(report + ".failed").touch()  # the reference child waits for this run's folder
            raise AssertionError(f"the training script failed with posformers:\n{result.stderr[-10000:]}")
        return json.loads(Path(report).read_text())

    def dropin_run(self) -> dict:
        """What the user's script reported, run with `posformers.enable()` at its top."""
        return self._dropin.result()

    def reference(self) -> dict:
        """Everything the child without posformers computed, and (`report`) what it said about posformers."""
        if self._reference_result is None:
            report = self._reference.result()
            self._reference_result = {**torch.load(self.work / "reference.pt", weights_only=True), "report": report}
        return self._reference_result

    def close(self):
        self._executor.shutdown(wait=True)


@pytest.fixture(scope="module")
def children(folders, tmp_path_factory):
    started = Children(folders, tmp_path_factory.mktemp("children"))
    yield started
    started.close()


# ---------------------------------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------------------------------


def assert_same(actual, expected, tolerance: float = TOLERANCE, where: str = "") -> None:
    """Two nested outputs (dicts, lists, strings, numbers, tensors) have the same structure, equal strings and
    integers, and floats and tensors within `tolerance`."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and sorted(actual) == sorted(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], tolerance, f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, tolerance, f"{where}[{index}]")
    elif isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape, where
        diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
        assert diff <= tolerance, f"{where}: max abs diff {diff}"
    elif isinstance(expected, float):
        assert abs(actual - expected) <= tolerance, f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def assert_dropin(model) -> None:
    """`model` is posformers' drop-in class (named as transformers', in posformers.dropin)."""
    assert type(model).__module__ == DROPIN, type(model)


def real_tokens(texts: list[str]) -> list[int]:
    """How many tokens each text has, [CLS] and [SEP] included."""
    return [len(TOKENIZER(text)["input_ids"]) for text in texts]


# ---------------------------------------------------------------------------------------------------------------------
# sentence-transformers
# ---------------------------------------------------------------------------------------------------------------------


def test_sentence_transformer_encodes_and_trains_like_transformers(folders, children, tmp_path):
    """SentenceTransformer(folder) over a transformers DeBERTa-v3 folder loads posformers' class and embeds as without
    posformers; one SentenceTransformerTrainer step (MultipleNegativesRankingLoss) has the same loss and leaves the
    same weights, and the embeddings after it (inference after an optimizer step) are transformers' again."""
    with posformers.enabled():
        ours = client_sentence_transformer(folders["deberta-v3"], SENTENCES, ST_PAIRS, str(tmp_path))
    assert ours["module"] == DROPIN
    reference = children.reference()["sentence_transformer"]
    assert reference["module"].startswith("transformers.models.deberta_v2")
    assert_same(ours["embeddings"], reference["embeddings"], where="embeddings")
    assert_same(ours["loss"], reference["loss"], tolerance=1e-4, where="loss")
    assert_same(ours["weights"], reference["weights"], tolerance=1e-4, where="weights")
    assert_same(ours["trained_embeddings"], reference["trained_embeddings"], tolerance=1e-4, where="trained_embeddings")


def test_cross_encoder_predicts_and_trains_like_transformers(folders, children, tmp_path):
    """CrossEncoder(folder) over a one-label transformers DeBERTa-v3 classifier loads posformers' class and scores MRPC
    pairs as without posformers; one CrossEncoderTrainer step (BinaryCrossEntropyLoss) has the same loss and leaves the
    same weights, and the scores after it (inference after an optimizer step) are transformers' again."""
    with posformers.enabled():
        ours = client_cross_encoder(folders["deberta-v3-rerank"], CE_PAIRS, CE_LABELS, str(tmp_path))
    assert ours["module"] == DROPIN
    reference = children.reference()["cross_encoder"]
    assert reference["module"].startswith("transformers.models.deberta_v2")
    assert_same(ours["scores"], reference["scores"], where="scores")
    assert_same(ours["loss"], reference["loss"], tolerance=1e-4, where="loss")
    assert_same(ours["weights"], reference["weights"], tolerance=1e-4, where="weights")
    assert_same(ours["trained_scores"], reference["trained_scores"], tolerance=1e-4, where="trained_scores")


# ---------------------------------------------------------------------------------------------------------------------
# transformers pipelines
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_pipeline_gives_transformers_outputs(case, folders, children):
    """`transformers.pipeline(task, model=folder)` while enabled runs posformers' class and reports what the same
    pipeline reports without posformers: every label, token, index and offset, and scores to 1e-5 (batched, so padded;
    feature-extraction compared at real tokens)."""
    spec = PIPELINE_CASES[case]
    with posformers.enabled():
        ours = client_pipeline(spec, folders[spec["model"]])
    # DeBERTa's masked-LM models keep transformers' head over posformers' encoder
    assert DROPIN in (ours["module"], ours["encoder"]), ours
    reference = children.reference()["pipelines"][case]
    assert reference["module"].startswith("transformers.models."), reference["module"]
    actual, expected = ours["output"], reference["output"]
    if spec["task"] == "feature-extraction":  # rows at the padded length of their batch: the real tokens only
        lengths = real_tokens(spec["inputs"])
        actual = [torch.tensor(rows)[0, :n] for rows, n in zip(actual, lengths)]
        expected = [torch.tensor(rows)[0, :n] for rows, n in zip(expected, lengths)]
    assert_same(actual, expected)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer in a user's script
# ---------------------------------------------------------------------------------------------------------------------


def test_trainer_script_trains_like_transformers_and_saves_transformers_format(children):
    """The user's Trainer script with `posformers.enable()` at its top trains posformers' class with the training
    losses, the evaluation losses (every 2 steps: inference between optimizer steps) and the final weights of the same
    script without posformers; the folder it saves is transformers' format (model_type deberta-v2, no auto_map, no
    code), and transformers without posformers loads it as its own class with the same logits."""
    dropin = children.dropin_run()
    reference = children.reference()
    plain = json.loads((children.work / "plain.json").read_text())
    assert dropin["class"] == f"{DROPIN}.DebertaV2ForSequenceClassification"
    assert plain["class"] == "transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2ForSequenceClassification"
    assert len(dropin["losses"]) == len(plain["losses"]) == 4
    assert_same(dropin["losses"], plain["losses"], tolerance=1e-4, where="losses")
    assert len(dropin["eval_losses"]) == len(plain["eval_losses"]) == 2  # after steps 2 and 4
    # the same weights (to ~1e-7) give the same evaluation: transformers' tolerance, not training's
    assert_same(dropin["eval_losses"], plain["eval_losses"], where="eval_losses")
    assert_same(torch.tensor(dropin["logits"]), torch.tensor(plain["logits"]), tolerance=1e-4, where="logits")

    output = children.work / "dropin"
    config = json.loads((output / "config.json").read_text())
    assert config["model_type"] == "deberta-v2" and "auto_map" not in config
    assert config["architectures"] == ["DebertaV2ForSequenceClassification"]
    assert not list(output.rglob("*.py"))
    ours, theirs = load_file(output / "model.safetensors"), load_file(children.work / "plain" / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    assert_same(ours, theirs, tolerance=1e-4, where="weights")

    reloaded = reference["dropin_reloaded"]
    assert reloaded["class"] == plain["class"]
    assert_same(reloaded["logits"], torch.tensor(dropin["logits"]), where="reloaded logits")
    assert reference["report"] == {"posformers_found": False, "posformers": []}


# ---------------------------------------------------------------------------------------------------------------------
# PEFT
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_on_an_enabled_model_has_transformers_logits_and_gradients(folders, children):
    """get_peft_model (LoRA on query_proj/value_proj, SEQ_CLS) over AutoModelForSequenceClassification while enabled
    wraps posformers' class under transformers' module names, in transformers' order: the same seed gives the same
    adapters; the logits, the loss and every trainable gradient (LoRA A and B, the classifier's copy) after one
    backward equal transformers'."""
    with posformers.enabled():
        ours = client_peft(folders["deberta-v3-sst2"], *zip(*PEFT_ROWS))
    assert ours["module"] == DROPIN
    reference = children.reference()["peft"]
    assert reference["module"].startswith("transformers.models.deberta_v2")
    assert_same(ours["lora_init"], reference["lora_init"], tolerance=0.0)
    assert sorted(ours["grads"]) == sorted(reference["grads"])
    assert any(".lora_A." in name for name in ours["grads"]) and any(".lora_B." in name for name in ours["grads"])
    assert_same(ours["logits"], reference["logits"])
    assert_same(ours["eval_logits"], reference["eval_logits"])
    assert abs(ours["loss"] - reference["loss"]) <= TOLERANCE
    for name, grad in reference["grads"].items():
        torch.testing.assert_close(ours["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# posformers.optimize
# ---------------------------------------------------------------------------------------------------------------------


def sst2_batch(count: int = 8) -> dict:
    rows = sst2("train", count)
    batch = dict(TOKENIZER([text for text, _ in rows], padding=True, return_tensors="pt"))
    assert 0 in batch["attention_mask"], "the batch should hold padding"
    return batch


@pytest.mark.parametrize("name", ["deberta-v3-sst2", "roformer-mlm"])
def test_optimize_converts_a_transformers_model_in_place(name):
    """`posformers.optimize(model)` on a model transformers built returns the same object, now posformers' class,
    with the same parameter objects and state_dict keys; its outputs at real tokens equal the model's before, its
    gradients the unconverted model's, and an optimizer created before the conversion steps it as it steps the
    unconverted model."""
    batch = sst2_batch()
    if name == "roformer-mlm":  # every real token is a target
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    else:
        labels = torch.tensor([label for _, label in sst2("train", 8)])
    model, twin = transformers_model(name), transformers_model(name)
    initial = {key: value.clone() for key, value in twin.state_dict().items()}
    with torch.no_grad():
        before = model(**batch).logits
    parameters = dict(model.named_parameters())
    keys = sorted(model.state_dict())
    # what an optimizer's saved state is indexed by: the order of the trainable parameters
    trainable = [name for name, parameter in parameters.items() if parameter.requires_grad]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin)]

    assert posformers.optimize(model) is model
    assert_dropin(model)
    assert sorted(model.state_dict()) == keys
    converted = dict(model.named_parameters())
    assert converted.keys() == parameters.keys()
    assert [name for name, parameter in converted.items() if parameter.requires_grad] == trainable
    assert all(converted[key] is parameter for key, parameter in parameters.items())
    with torch.no_grad():
        after = model(**batch).logits
    if after.dim() == 3:  # per-token logits: real tokens only
        mask = batch["attention_mask"].bool()
        after, before = after[mask], before[mask]
    assert_same(after, before)

    for m in (model, twin):
        m.train()
        m(**batch, labels=labels).loss.backward()
    gradients = {name: p.grad for name, p in twin.named_parameters() if p.grad is not None}
    assert gradients.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(parameter.grad, gradients[name], rtol=1e-4, atol=1e-6, msg=name)
    for optimizer in optimizers:
        optimizer.step()
    trained, expected = model.state_dict(), twin.state_dict()
    assert not torch.equal(trained[trainable[0]], initial[trainable[0]]), "the step should change the embeddings"
    for key, value in expected.items():
        torch.testing.assert_close(trained[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_optimize_reaches_the_model_inside_a_sentence_transformer(folders):
    """A SentenceTransformer loaded without posformers holds transformers' DebertaV2Model; `posformers.optimize` on the
    SentenceTransformer converts that inner model, and the embeddings stay the same."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folders["deberta-v3"], device="cpu")
    assert type(model[0].model).__module__.startswith("transformers.models.deberta_v2")
    before = model.encode(SENTENCES, batch_size=4, convert_to_tensor=True)
    assert posformers.optimize(model) is model
    assert_dropin(model[0].model)
    assert_same(model.encode(SENTENCES, batch_size=4, convert_to_tensor=True), before)
