"""`HubMethods`, named in each model's `PreTrainedModel` class line: transformers' loading and pushing, with
posformers' checks of weight files on load and its model card on push.

This file travels with the model files to `trust_remote_code` users, so it imports only the standard library and its
siblings. The card is written by `posformers.integrations.hub` (huggingface_hub's card API), found when a push runs:
where posformers is not installed, pushing is transformers' own.
"""

import importlib

from .loading import checked_from_pretrained


def card_code():
    """The module `posformers.integrations.hub`, or None where posformers is not installed."""
    try:
        return importlib.import_module("posformers.integrations.hub")
    except ModuleNotFoundError as error:
        if error.name != "posformers":  # posformers is there but broken: say so
            raise
        return None


class HubMethods:
    """Inherit it before `PreTrainedModel`.

    - `from_pretrained`: weight files that are not what they claim (truncated, corrupted, a missing shard, a wrong
      shape or dtype, a pickle that would run code) end in one `CheckpointError` naming the file (models/loading.py).
    - `push_to_hub` and `save_pretrained(push_to_hub=True)` upload the posformers model card with the weights, in one
      commit; the card options (`license`, `base_model`, `overwrite_model_card`) are documented at
      `posformers.integrations.hub.push_to_hub`.
    """

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        load = super().from_pretrained
        return checked_from_pretrained(load, cls, pretrained_model_name_or_path, *model_args, **kwargs)

    def push_to_hub(self, repo_id, **kwargs):
        if (hub := card_code()) is None:
            return super().push_to_hub(repo_id, **kwargs)
        return hub.push_to_hub(self, repo_id, **kwargs)

    def save_pretrained(self, save_directory, is_main_process=True, state_dict=None, push_to_hub=False, **kwargs):
        if (hub := card_code()) is None:
            return super().save_pretrained(save_directory, is_main_process, state_dict, push_to_hub, **kwargs)
        save = super().save_pretrained
        return hub.save_pretrained(self, save, save_directory, is_main_process, state_dict, push_to_hub, **kwargs)
