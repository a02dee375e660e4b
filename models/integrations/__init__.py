"""posformers beyond the models: the Hub, ONNX export, pipelines and PEFT."""
