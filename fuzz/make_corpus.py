#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (fuzz/*_fuzz.cpp) into fuzz/corpus/<target>/: small valid
files of each format plus a few near misses, so mutation starts from inputs that reach deep into each reader.
Deterministic; the output is committed. Usage: fuzz/make_corpus.py [OUT_DIR]   (default fuzz/corpus)
"""
import gzip
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, raw bytes)] laid out in order, as the format's writers do."""
    header, off, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def wav(tag, channels, rate, bits, frames, declared=None):
    """A RIFF/WAVE file: format tag 1 (PCM) or 3 (float); `declared` overrides the data chunk's size."""
    data = frames
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, tag, channels, rate, rate * channels * bits // 8, channels * bits // 8, bits) +
            b"data" + struct.pack("<I", len(data) if declared is None else declared) + data)


def png_rgb(w, h, depth=8, color=2):
    """A PNG of w x h pixels (colour type `color`: 0 gray, 2 RGB, 6 RGBA) with a ramp, written with zlib."""
    import zlib
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[color] * depth // 8
    raw = b"".join(b"\0" + bytes((x * 37 + y * 11 + c) % 256 for x in range(w) for c in range(ch)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def main():
    # Sound files (audio_fuzz): 16-bit PCM mono, float stereo, a header promising more than the file holds.
    put("audio_fuzz", "pcm16_mono", wav(1, 1, 16000, 16, struct.pack("<8h", 0, 1000, -1000, 32767, -32768, 5, 6, 7)))
    put("audio_fuzz", "f32_stereo", wav(3, 2, 48000, 32, struct.pack("<6f", 0.5, -0.5, 0.25, 0.125, 1.0, -1.0)))
    put("audio_fuzz", "truncated", wav(1, 1, 22050, 16, struct.pack("<4h", 1, 2, 3, 4), declared=4000))
    # Images (image_fuzz): PNG RGB 8-bit, gray 16-bit, RGBA; JPEG and WebP headers reach their decoders' entry.
    put("image_fuzz", "rgb8.png", png_rgb(4, 3))
    put("image_fuzz", "gray16.png", png_rgb(3, 2, depth=16, color=0))
    put("image_fuzz", "rgba.png", png_rgb(2, 2, color=6))
    put("image_fuzz", "jpeg_soi", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9")
    put("image_fuzz", "webp_riff", b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00\x2f\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00")
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    put("safetensors_fuzz", "f32", safetensors([("w", "F32", [2, 2], f32(1, 2, 3, 4))], {"mgn.step": "3", "format": "pt"}))
    put("safetensors_fuzz", "mixed", safetensors([
        ("a", "F16", [3], struct.pack("<3H", 0x3C00, 0xC000, 0x7BFF)),
        ("b", "BF16", [2], struct.pack("<2H", 0x3F80, 0xFF80)),
        ("c", "I32", [2], struct.pack("<2i", -7, 2147483647)),
        ("d", "I64", [1], struct.pack("<q", -(1 << 40))),
        ("e", "F64", [1], struct.pack("<d", 0.5)),
        ("f", "BOOL", [2], b"\x00\x01"),
        ("g", "U8", [1], b"\xff"), ("h", "I8", [1], b"\x80"), ("i", "I16", [1], struct.pack("<h", -2)),
        ("s", "F32", [], f32(9))]))
    put("safetensors_fuzz", "empty_tensor", safetensors([("z", "F32", [0, 4], b"")]))
    put("safetensors_fuzz", "no_tensors", safetensors([], {"k": "v"}))
    put("safetensors_fuzz", "unpadded", safetensors([("w", "F32", [1], f32(1))], pad=False))

    idx = {"metadata": {"total_size": 12}, "weight_map": {"a": "model-00001-of-00001.safetensors",
                                                          "b": "model-00001-of-00001.safetensors"}}
    put("safetensors_index_fuzz", "ok.json", json.dumps(idx))
    put("safetensors_index_fuzz", "missing_tensor.json",
        json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}}))
    put("safetensors_index_fuzz", "unsafe_path.json", json.dumps({"weight_map": {"a": "../x.safetensors"}}))

    def idx_file(dims, payload, type_code=0x08):
        return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload
    put("idx_fuzz", "images", idx_file([2, 3, 3], bytes(range(18))))
    put("idx_fuzz", "labels", idx_file([4], bytes([0, 9, 3, 1])))
    put("idx_fuzz", "rank4", idx_file([1, 1, 2, 2], bytes(4)))
    put("idx_fuzz", "float_type", idx_file([1], b"\x00\x00\x00\x00", 0x0D))
    put("idx_fuzz", "gzip_magic", gzip.compress(idx_file([1], b"\x05"), mtime=0)[:16])

    vocab = {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "c": 4, "abc": 5, "<0x78>": 6, "\u0120": 7, "<|endoftext|>": 8}
    base = {"version": "1.0",
            "added_tokens": [{"id": 8, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "trim_offsets": False},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                      "ignore_merges": False, "vocab": vocab, "merges": ["a b", "ab c"]}}
    put("tokenizer_fuzz", "bytelevel.json", json.dumps(base, indent=1))
    tpl = dict(base)
    tpl["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [8],
                                                                  "tokens": ["<|endoftext|>"]}}}
    tpl["model"] = dict(base["model"], merges=[["a", "b"], ["ab", "c"]])
    put("tokenizer_fuzz", "template.json", json.dumps(tpl))
    seq = dict(base)
    seq["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]}
    seq["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}
    seq["post_processor"] = {"type": "RobertaProcessing", "cls": ["a", 0], "sep": ["b", 1]}
    put("tokenizer_fuzz", "sequence.json", json.dumps(seq))

    put("tokenizer_config_fuzz", "strings.json", json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    put("tokenizer_config_fuzz", "objects.json", json.dumps(
        {"bos_token": {"content": "<s>", "special": True}, "eos_token": {"content": "</s>", "lstrip": False},
         "model_max_length": 2048, "chat_template": "{{ x }}"}))
    put("tokenizer_config_fuzz", "nulls.json", json.dumps({"bos_token": None, "eos_token": "ab"}))

    smollm2 = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu",
               "hidden_size": 576, "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
               "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
               "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
               "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
               "use_cache": True, "vocab_size": 49152}
    put("llama_config_fuzz", "smollm2.json", json.dumps(smollm2, indent=2))
    put("llama_config_fuzz", "tiny.json", json.dumps({"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "num_key_value_heads": 2,
                                                      "intermediate_size": 32, "head_dim": 8,
                                                      "tie_word_embeddings": False, "attention_bias": False}))
    nnef_seeds()


def nnef_dat(shape, raw, bits=32, code=0):
    """An NNEF binary tensor file: 128-byte header (magic 4E EF, version 1.0, length, rank, extents[8], bits, item
    type, reserved) and the raw items."""
    dims = list(shape) + [0] * (8 - len(shape))
    return b"\x4e\xef\x01\x00" + struct.pack("<II8III", len(raw), len(shape), *dims, bits, code) + b"\0" * 76 + raw


def nnef_seeds():
    # Tensor files alone (they start with the magic) and graphs with the bytes every variable holds after a NUL.
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    put("nnef_fuzz", "f32.dat", nnef_dat([2, 2], f32(1, 2, 3, 4)))
    put("nnef_fuzz", "f16.dat", nnef_dat([3], struct.pack("<3H", 0x3C00, 0xC000, 0x7BFF), bits=16))
    put("nnef_fuzz", "bool1.dat", nnef_dat([9], b"\x9d\x80", bits=1, code=5))
    put("nnef_fuzz", "i64.dat", nnef_dat([2], struct.pack("<2q", -3, 1 << 40), bits=64, code=4))
    put("nnef_fuzz", "truncated.dat", nnef_dat([4], f32(1, 2, 3, 4))[:-3])
    w = nnef_dat([4, 3], f32(*[0.5] * 12))
    mlp = """version 1.0;
extension KHR_enable_operator_expressions;
graph G( x ) -> ( y, z )
{
    x = external<scalar>(shape = [2, 3]);   # input
    w = variable<scalar>(shape = [4, 3], label = 'fc/w');
    h = linear(x, w, 0.0);
    (m, v) = moments(h, axes = [1]);
    [a, b] = split(h, axis = 1, ratios = [1, 1]);
    y = softmax(relu(sub(h, m)), axes = [1]);
    z = concat([a, b, mul(a, 2.0)], axis = 1);
}
"""
    put("nnef_fuzz", "mlp.nnef", mlp.encode() + b"\0" + w)
    conv = """version 1.0;
graph C( x ) -> ( y )
{
    x = external(shape = [1, 2, 6, 6]);
    f = variable(shape = [4, 3], label = 'f');
    c = conv(x, reshape(f, shape = [2, 2, 1, 3]), padding = [], stride = [2, 1], groups = 1);
    p = max_pool(c, size = [1, 1, 2, 2], border = 'ignore', padding = [(0, 0), (0, 0), (1, 0), (0, 1)]);
    q = avg_pool(p, size = [1, 1, 2, 2], border = 'constant');
    b = batch_normalization(q, 0.5, 2.0, 0.1, 1.5, epsilon = 1e-5);
    t = transpose(b, axes = [0, 2, 1]);
    s = slice(t, axes = [1], begin = [0], end = [-1], stride = [1]);
    y = pad(reshape(s, shape = [0, -1]), padding = [(0, 0), (1, 2)], value = 1.0);
}
"""
    put("nnef_fuzz", "conv.nnef", conv.encode() + b"\0" + w)
    put("nnef_fuzz", "errors.nnef", b"version 1.0;\ngraph G( x ) -> ( y ) { x = external(shape = [2]); y = frob(x, 'a); }")


if __name__ == "__main__":
    main()
