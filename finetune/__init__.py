"""posformers' fine-tuning scripts (posformers-glue, -qa, -ner, -mc, -pretrain, -littlebird-recipe): the train extra."""

from posformers._extras import TRAIN_MODULES, install_hint, missing

# Every script imports this package first: a missing extra is one line, not a traceback from deep inside a script.
if _missing := missing(TRAIN_MODULES):
    raise SystemExit(
        f"posformers.finetune needs the train extra ({', '.join(_missing)} not installed): {install_hint('train')}"
    )
