"""Registration of posformers models with transformers' Auto classes, driven by each model's AUTO_MAP."""

import transformers


def register(config_class, auto_map: dict[str, str], module) -> None:
    """Register `config_class` and every head named in `auto_map` with the matching Auto factory.

    auto_map: {"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel", ...}, the map that
    `save_pretrained` also writes into config.json for trust_remote_code users; `module` holds the model classes.
    Each model class also remembers its Auto class, which makes `save_pretrained` copy the model files beside the
    weights (and gives the head's pipeline tag to the model card).
    """
    transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class("AutoConfig")
    for auto_name, target in auto_map.items():
        if auto_name == "AutoConfig":
            continue
        model_class = getattr(module, target.rsplit(".", 1)[1])
        getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_name)
