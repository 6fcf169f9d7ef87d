import sys, json, logging
from pathlib import Path
from index_builder.reader import Fields
from softknn.bundle import read_manifest
from softknn.encoder import Encoder
from softknn.eval_cli import prepare_validation
layer = int(sys.argv[1])
enc = Encoder()
m = read_manifest(Path("artifacts/eval/bundles/banking77"))
p, held = prepare_validation(Path("/work/shared/data/banking77/train.csv"), Fields("id", "text", "category"), m,
                             Path(f"artifacts/eval/banking77/validation/L{layer}"), enc, layer=layer, progress=False)
print(p, len(held))
