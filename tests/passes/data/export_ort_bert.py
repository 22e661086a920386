r"""Re-make ort_bert_tiny.onnx in this folder (not run by the tests).

A BERT encoder as users get it from onnxruntime's transformer optimizer: transformers'
BertModel (eager attention, the pattern the optimizer fuses; 2 layers, hidden 32, 4 heads,
vocabulary 128, seeded random weights), exported by torch's TorchScript exporter at opset
14 with a dynamic batch and sequence, then
`onnxruntime.transformers.optimizer.optimize_model(model_type="bert", num_heads=4,
hidden_size=32, opt_level=0)`, which writes com.microsoft EmbedLayerNormalization,
Attention, SkipLayerNormalization and BiasGelu. Run with a Python that has torch,
transformers and onnxruntime (transformers 5.24, torch 2.13, onnxruntime 1.32 made the
committed file):
    python tests/passes/data/export_ort_bert.py
"""

import pathlib
import tempfile

import torch
import transformers
from onnxruntime.transformers import optimizer

HERE = pathlib.Path(__file__).parent


class _Encoder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask, segments):
        return self.model(input_ids=ids, attention_mask=mask,
                          token_type_ids=segments).last_hidden_state


def main() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    model = _Encoder(transformers.BertModel(config).eval())
    ids = torch.randint(0, 128, (2, 16))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "bert.onnx"
        with torch.no_grad():
            torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                              str(path), input_names=names, output_names=["hidden"],
                              dynamic_axes={n: {0: "batch", 1: "sequence"}
                                            for n in [*names, "hidden"]},
                              opset_version=14, dynamo=False)
        fused = optimizer.optimize_model(str(path), model_type="bert", num_heads=4,
                                         hidden_size=32, opt_level=0)
        fused.save_model_to_file(str(HERE / "ort_bert_tiny.onnx"))


if __name__ == "__main__":
    main()
