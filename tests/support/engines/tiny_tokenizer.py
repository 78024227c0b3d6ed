"""Write a tiny word-level tokenizer ("w0" .. "w1999") to DIR, offline; run in an engine venv (transformers).

The benchmark clients need a tokenizer for the random dataset; the Hub is not reachable here, so the test
makes one whose words the stand-in server counts exactly (one word, one token).
Usage: python tiny_tokenizer.py DIR
"""

import sys

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(2000)}}
tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
).save_pretrained(sys.argv[1])
