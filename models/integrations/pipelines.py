"""Extractive question answering as a transformers pipeline, for all three models (and any ...ForQuestionAnswering);
docs/integrations.md, "Pipelines".

transformers 5 removed its "question-answering" pipeline, so posformers registers one under a name transformers does
not reserve, "extractive-question-answering" (importing this module registers it). It windows and decodes exactly as
`posformers-qa` evaluates (`posformers.finetune.qa_features`), so a pipeline answer is the script's answer. A
LittleBird tokenizer inherited from its BERT teacher says 512 in `model_max_length`, which is BERT's limit, not
LittleBird's: the config decides the window there (`window_length`).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForQuestionAnswering
from transformers.pipelines import PIPELINE_REGISTRY
from transformers.pipelines.base import ChunkPipeline

from posformers.finetune.qa_features import postprocess_predictions, prepare_features

TASK = "extractive-question-answering"
DEFAULT_MAX_SEQ_LEN = 384  # transformers' question-answering pipeline default
DEFAULT_MAX_STRIDE = 128


def window_length(model_config, tokenizer, max_seq_len: int | None) -> int | None:
    """Tokens per window: `max_seq_len`, else None (the whole document) for a model without a position limit, else
    min(tokenizer.model_max_length, max_position_embeddings, 384)."""
    if max_seq_len is not None:
        if max_seq_len < 8:
            raise ValueError(f"max_seq_len must be at least 8 tokens, got {max_seq_len}")
        return max_seq_len
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is None:
        return None
    return min(tokenizer.model_max_length, limit, DEFAULT_MAX_SEQ_LEN)


class QuestionAnsweringPipeline(ChunkPipeline):
    """Answer spans of `context` for `question`: {"answer", "score", "start", "end"} (a list of `top_k` of them when
    top_k > 1). Each window of a long context is one model call; the best span over all windows wins.

    Arguments (call time or construction time): max_seq_len, doc_stride, top_k (1), max_answer_len (30 tokens),
    handle_impossible_answer (False: SQuAD v2's "" answer when the null score wins)."""

    def _sanitize_parameters(
        self, max_seq_len=None, doc_stride=None, top_k=None, max_answer_len=None, handle_impossible_answer=None
    ):
        preprocess = {"max_seq_len": max_seq_len, "doc_stride": doc_stride}
        postprocess = {}
        if top_k is not None:
            if top_k < 1:
                raise ValueError(f"top_k must be at least 1, got {top_k}")
            postprocess["top_k"] = top_k
        if max_answer_len is not None:
            if max_answer_len < 1:
                raise ValueError(f"max_answer_len must be at least 1, got {max_answer_len}")
            postprocess["max_answer_len"] = max_answer_len
        if handle_impossible_answer is not None:
            postprocess["handle_impossible_answer"] = handle_impossible_answer
        return {key: value for key, value in preprocess.items() if value is not None}, {}, postprocess

    def __call__(self, *args, **kwargs):
        """qa(question=..., context=...), qa({"question": ..., "context": ...}) or qa([{...}, ...])."""
        if not args and "question" in kwargs and "context" in kwargs:
            question, context = kwargs.pop("question"), kwargs.pop("context")
            if isinstance(question, list) != isinstance(context, list):
                raise ValueError("question and context: give both as strings or both as lists of the same length")
            if isinstance(question, list):
                if len(question) != len(context):
                    raise ValueError(f"question and context: {len(question)} questions for {len(context)} contexts")
                args = ([{"question": q, "context": c} for q, c in zip(question, context)],)
            else:
                args = ({"question": question, "context": context},)
        return super().__call__(*args, **kwargs)

    def preprocess(self, inputs, max_seq_len=None, doc_stride=None):
        if not isinstance(inputs, dict) or not {"question", "context"} <= set(inputs):
            raise ValueError(f"inputs: expected a dict with 'question' and 'context', got {type(inputs).__name__}")
        question, context = inputs["question"], inputs["context"]
        if not question.strip() or not context.strip():
            raise ValueError("inputs: question and context must both hold text")
        question_token = self._question_token()
        max_length = window_length(self.model.config, self.tokenizer, max_seq_len)
        if max_length is None:  # one window: the whole document, as prepare_features writes the question
            asked = question.lstrip() if question_token is None else f"{question.lstrip()} {question_token}"
            max_length = len(self.tokenizer(asked, context)["input_ids"])
            doc_stride = 0
        elif doc_stride is None:
            doc_stride = min(max_length // 2, DEFAULT_MAX_STRIDE)
        example = {"id": ["0"], "question": [question], "context": [context]}
        features = prepare_features(
            example,
            self.tokenizer,
            max_length,
            doc_stride,
            with_labels=False,
            for_postprocessing=True,
            question_token=question_token,
        )
        names = [name for name in self.tokenizer.model_input_names if name in features]
        for i in range(len(features["input_ids"])):
            window = {name: torch.tensor([features[name][i]]) for name in names}
            yield {
                **window,
                "offset_mapping": features["offset_mapping"][i],
                "cls_index": features["cls_index"][i],
                "context": context,
                "is_last": i == len(features["input_ids"]) - 1,
            }

    def _question_token(self) -> str | None:
        """The [QUESTION] token a span-selection head (config.qa_head "span_selection") reads right after the question,
        as posformers-qa places it; None for the linear head."""
        if getattr(self.model.config, "qa_head", "linear") != "span_selection":
            return None
        from posformers.finetune.errors import ScriptError
        from posformers.finetune.run_qa import question_token

        try:
            return question_token(self.model.config, self.tokenizer)
        except ScriptError as error:
            raise ValueError(f"tokenizer: {error}") from None

    def _forward(self, inputs):
        extra = {key: inputs.pop(key) for key in ("offset_mapping", "cls_index", "context", "is_last")}
        output = self.model(**inputs)
        return {"start_logits": output.start_logits, "end_logits": output.end_logits, **extra}

    def postprocess(self, windows, top_k=1, max_answer_len=30, handle_impossible_answer=False):
        width = max(window["start_logits"].shape[-1] for window in windows)

        def logits(name: str) -> np.ndarray:  # (windows, width), padded with -inf
            rows = [window[name].float().reshape(-1).cpu().numpy() for window in windows]
            return np.stack([np.pad(row, (0, width - len(row)), constant_values=-np.inf) for row in rows])

        # datasets is the train extra's, as is posformers.finetune, whose import above says so in one line if missing
        from datasets import Dataset

        features = Dataset.from_dict(
            {
                "example_id": ["0"] * len(windows),
                "offset_mapping": [window["offset_mapping"] for window in windows],
                "cls_index": [window["cls_index"] for window in windows],
            }
        )
        examples = [{"id": "0", "context": windows[0]["context"]}]
        predictions = postprocess_predictions(
            examples,
            features,
            logits("start_logits"),
            logits("end_logits"),
            version_2_with_negative=handle_impossible_answer,
            n_best_size=max(20, top_k),
            max_answer_length=max_answer_len,
        )
        answers = [
            {
                "score": candidate["probability"],
                "start": candidate["answer_start"],
                "end": candidate["answer_start"] + len(candidate["text"]),
                "answer": candidate["text"],
            }
            for candidate in predictions.nbest["0"][:top_k]
        ]
        return answers[0] if top_k == 1 else answers


PIPELINE_REGISTRY.register_pipeline(
    TASK, pipeline_class=QuestionAnsweringPipeline, pt_model=AutoModelForQuestionAnswering, type="text"
)

__all__ = ["TASK", "QuestionAnsweringPipeline", "window_length"]
