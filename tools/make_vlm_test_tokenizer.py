#!/usr/bin/env python3
"""tests/data/server/vlm_qwen: the server tests' tokenizer (tok512, see
make_test_tokenizer.py) with Qwen2-VL's vision tokens added at the ids of the
tests/fixtures/vlm/qwen*_vl fixtures (image 512, video 513, vision start 514
and end 515) and Qwen2-VL's chat template, which writes
<|vision_start|><|image_pad|><|vision_end|> for each {"type": "image"} part.

usage: python3 tools/make_vlm_test_tokenizer.py (from the repository root)"""
import json

SRC, DST = "tests/data/server/tok512", "tests/data/server/vlm_qwen"
ADDED = {512: "<|image_pad|>", 513: "<|video_pad|>", 514: "<|vision_start|>", 515: "<|vision_end|>"}
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main():
    tok = json.load(open(f"{SRC}/tokenizer.json"))
    for i, t in ADDED.items():
        tok["added_tokens"].append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                    "normalized": False, "special": True})
    json.dump(tok, open(f"{DST}/tokenizer.json", "w"), ensure_ascii=False, separators=(",", ":"))
    cfg = json.load(open(f"{SRC}/tokenizer_config.json"))
    for i, t in ADDED.items():
        cfg["added_tokens_decoder"][str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True}
    cfg["chat_template"] = TEMPLATE
    cfg["eos_token"] = "<|im_end|>"
    with open(f"{DST}/tokenizer_config.json", "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
