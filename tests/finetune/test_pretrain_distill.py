"""LittleBird distillation with Padding Insertion (finetune/pretrain_distill.py) on real SST-2 and SQuAD text."""

import math

import datasets
import pytest
import torch
from conftest import TOKENIZER_DIR
from helpers.pretrain_corpus import squad_contexts, sst2_sentences
from safetensors.torch import load_file
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    TrainingArguments,
)

from posformers import LittleBirdConfig, LittleBirdForMaskedLM
from posformers.finetune.errors import ArgumentError
from posformers.finetune.pretrain_data import MASK_SEED, MaskingCollator, pack_batch, train_tokenizer
from posformers.finetune.pretrain_distill import (
    DistillArguments,
    DistillationTrainer,
    PaddingInsertionCollator,
    aligned_positions,
    distillation_kl,
    insertion_gaps,
)

IGNORE = -100


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def tiny_student(vocab_size: int, **overrides) -> LittleBirdForMaskedLM:
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        block_size=16,
        pack_length=8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return LittleBirdForMaskedLM(LittleBirdConfig(**{**fields, **overrides}))


def tiny_teacher(vocab_size: int, hidden_size: int = 32) -> BertForMaskedLM:
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)


# ---------------------------------------------------------------------------------------------------------------------
# Padding Insertion
# ---------------------------------------------------------------------------------------------------------------------


def sentence_features(tokenizer, count: int) -> list[dict]:
    return [{"input_ids": ids} for ids in tokenizer(sst2_sentences("dev")[:count])["input_ids"]]


def test_inserted_pads_are_masked_excluded_from_the_loss_and_keep_the_real_tokens_in_order(tokenizer):
    features = sentence_features(tokenizer, 16)
    collator = PaddingInsertionCollator(
        tokenizer,
        base_collator=MaskingCollator(tokenizer, mlm_probability=0.3),
        max_length=200,
        mean_run_length=8,
        generator=torch.Generator().manual_seed(0),
    )
    torch.manual_seed(0)
    batch = collator(features)
    teacher_real = batch["teacher_attention_mask"].bool()
    student_real = batch["attention_mask"].bool()
    inserted = 0
    for row, feature in enumerate(features):
        real_positions = student_real[row].nonzero().view(-1)
        # the student's real tokens are exactly the clean text's, in order, the first one at position 0
        assert real_positions[0] == 0
        assert torch.equal(batch["input_ids"][row, real_positions], batch["teacher_input_ids"][row, teacher_real[row]])
        assert torch.equal(batch["labels"][row, real_positions], batch["teacher_labels"][row, teacher_real[row]])
        assert torch.equal(batch["position_map"][row, real_positions], torch.arange(len(feature["input_ids"])))
        # every other student position is a pad: masked, no label, mapped to no teacher token
        pads = ~student_real[row]
        assert (batch["input_ids"][row, pads] == tokenizer.pad_token_id).all()
        assert (batch["labels"][row, pads] == IGNORE).all()
        assert (batch["position_map"][row, pads] == -1).all()
        inserted += int(pads[: real_positions[-1]].sum())
    assert inserted > 0, "no padding was inserted between real tokens"
    assert (batch["labels"] != IGNORE).sum() == (batch["teacher_labels"] != IGNORE).sum() > 0


def test_collator_works_on_its_own_without_labels(tokenizer):
    features = sentence_features(tokenizer, 4)
    batch = PaddingInsertionCollator(tokenizer, max_length=64, generator=torch.Generator().manual_seed(1))(features)
    assert "labels" not in batch
    lengths = [len(feature["input_ids"]) for feature in features]
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["input_ids"].shape[1] > max(lengths)


def test_inserted_lengths_follow_the_configuration():
    """4000 draws for a 20-token text: padded share, the uniform target length, runs and their mean length.

    Tolerances are 4 standard errors of each estimate (a false alarm about once in 16,000 runs per check); the
    uniformity check is a Kolmogorov-Smirnov distance against the discrete uniform CDF at the 0.1% level.
    """
    draws, num_real, probability, low, high, mean_run = 4000, 20, 0.7, 64, 256, 12.0
    generator = torch.Generator().manual_seed(0)
    samples = [insertion_gaps(num_real, probability, low, high, mean_run, generator) for _ in range(draws)]
    padded = [gaps for gaps in samples if gaps.sum() > 0]

    share = len(padded) / draws
    assert abs(share - probability) < 4 * math.sqrt(probability * (1 - probability) / draws)

    lengths = torch.tensor([num_real + int(gaps.sum()) for gaps in padded], dtype=torch.float64)
    assert lengths.min() >= low and lengths.max() <= high
    values = torch.arange(low, high + 1, dtype=torch.float64)
    empirical = (lengths[:, None] <= values).double().mean(0)
    uniform = (values - low + 1) / (high - low + 1)
    assert (empirical - uniform).abs().max() < 1.95 / math.sqrt(len(padded))

    run_lengths, runs_per_example = [], []
    for gaps in padded:
        assert gaps[0] == 0, "padding before the first token would move it off position 0"
        runs = gaps[gaps > 0]
        pads = int(gaps.sum())
        assert len(runs) == min(max(round(pads / mean_run), 1), num_real - 1)
        run_lengths += runs.tolist()
        runs_per_example.append(len(runs))
    # the runs' mean is pads / runs per example; rounding the run count moves it by at most half a run's share
    assert abs(sum(run_lengths) / len(run_lengths) - mean_run) < 0.05 * mean_run


def test_probability_zero_and_one_and_short_texts():
    generator = torch.Generator().manual_seed(0)
    assert all(insertion_gaps(10, 0.0, 0, 100, 4, generator).sum() == 0 for _ in range(50))
    assert all(insertion_gaps(10, 1.0, 50, 100, 4, generator).sum() >= 40 for _ in range(50))
    assert insertion_gaps(1, 1.0, 0, 100, 4, generator).tolist() == [0]  # no gap to fill


# Float32 reordering noise of the outputs below is ~1e-7; the controls must differ by 10x this tolerance at least.
TOLERANCE = 1e-5


def model_outputs_at_real_tokens(model, batch, row=0):
    real = batch["attention_mask"][row].bool()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"][row : row + 1], attention_mask=batch["attention_mask"][row : row + 1]
        ).logits
    return logits[0, real]


def two_placements(tokenizer, seeds=(1, 2)):
    """The same SST-2 sentence with padding inserted two different ways, both within 4 blocks of 16 tokens."""
    features = sentence_features(tokenizer, 1)
    assert len(features[0]["input_ids"]) <= 16
    batches = [
        PaddingInsertionCollator(
            tokenizer, min_length=56, max_length=64, mean_run_length=5, generator=torch.Generator().manual_seed(seed)
        )(features)
        for seed in seeds
    ]
    assert not torch.equal(batches[0]["attention_mask"], batches[1]["attention_mask"])
    return batches


def test_outputs_at_real_tokens_depend_on_pad_placement_only_through_bialibi(tokenizer):
    """Within 4 blocks every block is visible to every query, and the pack attention has no position bias: with all
    BiALiBi slopes 0, the real tokens see the same keys however the pads are placed, so their outputs are the clean
    text's. Slopes make them differ (the distances changed), and so do pads that are not masked."""
    first, second = two_placements(tokenizer)
    clean = {key: first[f"teacher_{key}"] for key in ("input_ids", "attention_mask")}
    torch.manual_seed(0)
    flat = tiny_student(len(tokenizer), num_hidden_layers=2, bialibi_init=0.0).eval()
    reference = model_outputs_at_real_tokens(flat, clean)
    for batch in (first, second):
        torch.testing.assert_close(model_outputs_at_real_tokens(flat, batch), reference, rtol=0, atol=TOLERANCE)

    sloped = tiny_student(len(tokenizer), num_hidden_layers=2, bialibi_init=0.5).eval()
    differences = (model_outputs_at_real_tokens(sloped, first) - model_outputs_at_real_tokens(sloped, second)).abs()
    assert differences.max() > 10 * TOLERANCE

    first_real = first["attention_mask"][0].bool()
    with torch.no_grad():
        unmasked = flat(input_ids=first["input_ids"], attention_mask=torch.ones_like(first["attention_mask"]))
    assert (unmasked.logits[0, first_real] - reference).abs().max() > 10 * TOLERANCE


# ---------------------------------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------------------------------


def hand_kl(student_row: list[float], teacher_row: list[float], temperature: float) -> float:
    """KL(p_teacher || p_student) of temperature-T softmaxes, written out with math."""

    def softmax(row):
        exps = [math.exp(value / temperature) for value in row]
        return [value / sum(exps) for value in exps]

    p, q = softmax(teacher_row), softmax(student_row)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_kl_uses_the_configured_temperature(temperature):
    student = [[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 1.0, -1.0]]
    teacher = [[2.0, 0.0, -1.0, 1.0], [1.5, -0.5, 0.0, 0.0]]
    expected = temperature**2 * sum(hand_kl(s, t, temperature) for s, t in zip(student, teacher)) / len(student)
    got = distillation_kl(torch.tensor(student), torch.tensor(teacher), temperature)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert distillation_kl(torch.tensor(teacher), torch.tensor(teacher), temperature).item() == pytest.approx(0.0)


def test_aligned_positions_pair_each_student_token_with_its_teacher_token():
    position_map = torch.tensor([[0, -1, -1, 1, 2, -1], [0, 1, -1, -1, -1, -1]])
    rows, student_positions, teacher_positions = aligned_positions(position_map)
    assert rows.tolist() == [0, 0, 0, 1, 1]
    assert student_positions.tolist() == [0, 3, 4, 0, 1]
    assert teacher_positions.tolist() == [0, 1, 2, 0, 1]


# ---------------------------------------------------------------------------------------------------------------------
# Distillation end to end on real text
# ---------------------------------------------------------------------------------------------------------------------


def packed_squad(tokenizer, contexts: list[str], max_seq_length: int = 48) -> list[dict]:
    packed = pack_batch(contexts, tokenizer, max_seq_length, word_starts=False)
    return [{"input_ids": ids} for ids in packed["input_ids"]]


def briefly_trained_teacher(tokenizer, features, steps: int = 40) -> BertForMaskedLM:
    """A tiny BERT given a few MLM steps on the corpus: its distributions are far from uniform, a target to learn."""
    torch.manual_seed(0)
    teacher = tiny_teacher(len(tokenizer))
    collator = MaskingCollator(tokenizer, mlm_probability=0.3)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=1e-2)
    teacher.train()
    for step in range(steps):
        batch = collator(features[(step * 16) % len(features) :][:16])
        teacher(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return teacher.eval()


def distill_trainer(tokenizer, teacher, student, train, held_out, output_dir, distill_args=None, **training):
    distill_args = distill_args or DistillArguments(
        teacher_name_or_path="unused: the teacher is given", temperature=2.0, padding_insertion_max_length=128
    )
    options = dict(
        output_dir=str(output_dir),
        max_steps=60,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        learning_rate=5e-3,
        warmup_steps=0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1000,
        remove_unused_columns=False,
        use_cpu=True,
        seed=0,
    )
    collator = PaddingInsertionCollator(
        tokenizer,
        base_collator=MaskingCollator(tokenizer, mlm_probability=0.15),
        pad_to_multiple_of=getattr(student.config, "block_size", None),
        **distill_args.padding_insertion_options(),
    )
    return DistillationTrainer(
        model=student,
        teacher=teacher,
        distill_args=distill_args,
        args=TrainingArguments(**{**options, **training}),
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=collator,
    )


@pytest.fixture(scope="module")
def squad_corpus():
    """A WordPiece vocabulary of 600 trained on 120 SQuAD contexts (posformers-pretrain's --train_tokenizer), and
    the contexts packed into 48-token sequences: 32 held out, the rest for training."""
    contexts = squad_contexts()[:120]
    tokenizer = train_tokenizer(datasets.Dataset.from_dict({"text": contexts}), "wordpiece", vocab_size=600)
    features = packed_squad(tokenizer, contexts)
    # held-out examples carry a mask seed: the same masks and insertions at every evaluation
    held_out = [{**feature, MASK_SEED: 0} for feature in features[:32]]
    return tokenizer, features[32:], held_out


def test_distillation_on_squad_lowers_the_held_out_loss_with_a_frozen_teacher(squad_corpus, tmp_path):
    tokenizer, train, held_out = squad_corpus
    teacher = briefly_trained_teacher(tokenizer, train)
    teacher_weights = {name: tensor.clone() for name, tensor in teacher.state_dict().items()}
    torch.manual_seed(0)
    student = tiny_student(len(tokenizer))
    trainer = distill_trainer(
        tokenizer, teacher, student, train, held_out, tmp_path / "run", save_strategy="steps", save_steps=60
    )
    before = trainer.evaluate()
    assert before["eval_loss"] == pytest.approx(trainer.evaluate()["eval_loss"])  # a fixed held-out set
    trainer.train()
    after = trainer.evaluate()
    print(
        f"held-out distillation loss {before['eval_loss']:.4f} -> {after['eval_loss']:.4f}, accuracy vs teacher "
        f"{before['eval_accuracy_vs_teacher']:.3f} -> {after['eval_accuracy_vs_teacher']:.3f}"
    )
    assert after["eval_loss"] < 0.5 * before["eval_loss"]
    assert after["eval_accuracy_vs_teacher"] > before["eval_accuracy_vs_teacher"] + 0.1

    # the teacher stayed frozen: eval mode, no gradients, the same weights
    assert not trainer.teacher.training
    assert all(not parameter.requires_grad and parameter.grad is None for parameter in teacher.parameters())
    for name, tensor in teacher.state_dict().items():
        assert torch.equal(tensor, teacher_weights[name]), name

    # the checkpoint is a normal LittleBird checkpoint of the student alone
    checkpoint = tmp_path / "run" / "checkpoint-60"
    saved = load_file(checkpoint / "model.safetensors")
    assert set(saved) <= set(student.state_dict()) and not any("bert" in name for name in saved)
    loaded = AutoModelForMaskedLM.from_pretrained(checkpoint)
    assert type(loaded) is LittleBirdForMaskedLM
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, student.state_dict()[name], rtol=0, atol=0, msg=name)


def test_hidden_state_mse_is_added_at_the_real_tokens(squad_corpus, tmp_path):
    tokenizer, train, held_out = squad_corpus
    torch.manual_seed(0)
    teacher, student = tiny_teacher(len(tokenizer)).eval(), tiny_student(len(tokenizer)).eval()
    weighted = DistillArguments(teacher_name_or_path="given", hidden_mse_weight=3.0, padding_insertion_max_length=96)
    trainer = distill_trainer(tokenizer, teacher, student, train, held_out, tmp_path, distill_args=weighted)
    torch.manual_seed(1)
    batch = trainer.data_collator(held_out[:4])
    with torch.no_grad():
        total = trainer.distillation_terms(student, batch).loss
        student_out = student(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        )
        teacher_out = teacher(
            input_ids=batch["teacher_input_ids"],
            attention_mask=batch["teacher_attention_mask"],
            output_hidden_states=True,
        )
    rows, student_positions, teacher_positions = aligned_positions(batch["position_map"])
    kl = distillation_kl(student_out.logits[rows, student_positions], teacher_out.logits[rows, teacher_positions], 1.0)
    mse = (
        (
            student_out.hidden_states[-1][rows, student_positions]
            - teacher_out.hidden_states[-1][rows, teacher_positions]
        )
        ** 2
    ).mean()
    assert total.item() == pytest.approx((kl + 3.0 * mse).item(), rel=1e-5)


def test_the_last_steps_are_plain_mlm_without_the_teacher(squad_corpus, tmp_path):
    tokenizer, train, held_out = squad_corpus
    torch.manual_seed(0)
    teacher, student = tiny_teacher(len(tokenizer)), tiny_student(len(tokenizer))
    args = DistillArguments(teacher_name_or_path="given", mlm_after_distill_steps=2, padding_insertion_max_length=96)
    trainer = distill_trainer(tokenizer, teacher, student, train, held_out, tmp_path, distill_args=args, max_steps=5)
    calls = []
    teacher.register_forward_hook(lambda module, inputs, outputs: calls.append(module.training))
    trainer.train()
    assert len(calls) == 3  # steps 1-3 distil, steps 4-5 are MLM

    torch.manual_seed(2)
    batch = trainer.data_collator(train[:4])
    student.train()
    with torch.no_grad():
        loss = trainer.compute_loss(student, batch)
        expected = student(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss
    assert len(calls) == 3 and loss.item() == pytest.approx(expected.item())


# ---------------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"teacher_name_or_path": None}, "teacher_name_or_path"),
        ({"temperature": 0.0}, "--temperature must be > 0"),
        ({"padding_insertion_probability": 1.5}, "--padding_insertion_probability must be in"),
        ({"padding_insertion_min_length": 512, "padding_insertion_max_length": 256}, "max_length must be >= --padding"),
        ({"padding_insertion_mean_run_length": 0.5}, "padding_insertion_mean_run_length"),
        ({"kl_weight": 0.0}, "both 0"),
        ({"mlm_after_distill_steps": -1}, "--mlm_after_distill_steps must be >= 0"),
    ],
)
def test_impossible_arguments_are_refused(fields, message):
    with pytest.raises(ArgumentError, match=message):
        DistillArguments(**{"teacher_name_or_path": "bert", **fields}).check()


def test_the_collator_refuses_impossible_settings_on_its_own(tokenizer):
    with pytest.raises(ArgumentError, match="max_length must be >= min_length"):
        PaddingInsertionCollator(tokenizer, min_length=100, max_length=50)


def test_student_and_teacher_that_cannot_be_compared_are_refused(tokenizer, tmp_path):
    vocab = len(tokenizer)
    with pytest.raises(ArgumentError, match="vocab_size"):
        distill_trainer(tokenizer, tiny_teacher(vocab - 1), tiny_student(vocab), [], [], tmp_path)
    wide = DistillArguments(teacher_name_or_path="given", hidden_mse_weight=1.0)
    with pytest.raises(ArgumentError, match="equal hidden sizes"):
        distill_trainer(tokenizer, tiny_teacher(vocab, 64), tiny_student(vocab), [], [], tmp_path, distill_args=wide)
    with pytest.raises(ArgumentError, match="must be a LittleBirdForMaskedLM"):
        distill_trainer(tokenizer, tiny_teacher(vocab), tiny_teacher(vocab), [], [], tmp_path)


def test_insertions_follow_a_seeded_masking_collator_per_epoch_and_stay_fixed_on_held_out_examples(tokenizer):
    features = sentence_features(tokenizer, 8)
    masking = MaskingCollator(tokenizer, seed=3)
    collator = PaddingInsertionCollator(tokenizer, base_collator=masking, max_length=128)
    first, again = collator(features), collator(features)
    for key in ("input_ids", "attention_mask", "labels", "position_map"):
        assert torch.equal(first[key], again[key]), key  # a resumed run sees the same batch
    masking.epoch = 1
    assert not torch.equal(collator(features)["position_map"], first["position_map"])  # a new epoch inserts anew

    held_out = [{**feature, MASK_SEED: 0} for feature in features]
    unseeded = PaddingInsertionCollator(tokenizer, base_collator=MaskingCollator(tokenizer), max_length=128)
    assert torch.equal(unseeded(held_out)["position_map"], unseeded(held_out)["position_map"])
