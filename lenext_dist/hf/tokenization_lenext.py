"""`LenextTokenizer`: AutoTokenizer access to the run's SentencePiece model (`tokenizer.model`).

Encoding is SentencePiece's own `encode` on the text (as data_prep did, without BOS/EOS), not
transformers' conversion of the model to a `tokenizers` BPE, which treats whitespace runs
differently. Shipped inside every export; imports only transformers (+ its sentencepiece backend).
"""
from __future__ import annotations

from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class LenextTokenizer(SentencePieceBackend):
    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file=None, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                 pad_token=None, add_bos_token=False, add_eos_token=False, **kwargs):
        kwargs.setdefault("legacy", True)  # plain sp.encode: identical to data_prep
        self.add_bos_token, self.add_eos_token = add_bos_token, add_eos_token
        super().__init__(vocab_file=vocab_file, unk_token=unk_token, bos_token=bos_token,
                         eos_token=eos_token, pad_token=pad_token, add_bos_token=add_bos_token,
                         add_eos_token=add_eos_token, **kwargs)

    def _tokenize(self, text, **kwargs):
        return self.sp_model.encode(text, out_type=str)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        bos = [self.bos_token_id] if self.add_bos_token else []
        eos = [self.eos_token_id] if self.add_eos_token else []
        out = bos + token_ids_0 + eos
        if token_ids_1 is not None:
            out += bos + token_ids_1 + eos
        return out

    def convert_tokens_to_string(self, tokens):
        return self.sp_model.decode_pieces(tokens)


__all__ = ["LenextTokenizer"]
