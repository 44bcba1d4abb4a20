trtllm-serve deepseek-ai/DeepSeek-R1 --host 0.0.0.0 --port 8000 --backend pytorch --tp_size 8 --config trtllm-config.yaml
