"""The same split through the Python API, then the two parts run chained.

graphfix.run returns the backbone as `result.model` and the NMS part in
`result.artifacts["split-nms"]`; graphfix.save writes the backbone and
graphfix.nms.save_split the NMS part and the manifest beside it. graphfix.nms.run_split
runs backbone -> NMS part from the manifest; its outputs equal the original model's.
"""

import numpy as np
import onnxruntime as ort

import graphfix
import graphfix.nms

result = graphfix.run("det.onnx", passes="split-nms")
for record in result.report.passes:
    print(f"{record.spec}: {record.status}, {dict(record.counts)}")

graphfix.save(result.model, "api.onnx")
paths = graphfix.nms.save_split(result.artifacts["split-nms"], "api.onnx")
print(f"wrote {paths.backbone}, {paths.nms}, {paths.manifest}")

# 12 boxes (corners) around 3 objects, so NMS suppresses overlapping ones; class
# scores spread around the 0.3 threshold.
rng = np.random.default_rng(0)
centres = rng.uniform(0.2, 0.8, (3, 2)).repeat(4, axis=0)
xy = centres + rng.normal(0, 0.01, (12, 2))
size = 0.2 + rng.normal(0, 0.01, (12, 2))
feats = np.concatenate([xy - size / 2, xy + size / 2, rng.normal(-1, 1.5, (12, 3))],
                       axis=-1)[None].astype(np.float32)

split = graphfix.nms.run_split(paths.manifest, {"feats": feats})
session = ort.InferenceSession("det.onnx", providers=["CPUExecutionProvider"])
original = dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {"feats": feats}), strict=True))
for name, value in original.items():
    np.testing.assert_array_equal(split[name], value)
    print(f"{name}: shape {list(value.shape)}, split == original")
print(f"12 candidate boxes around 3 objects -> {len(original['labels'])} detections "
      f"(labels {original['labels'].tolist()})")
