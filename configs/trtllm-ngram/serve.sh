trtllm-serve meta-llama/Llama-3.1-8B-Instruct --host 0.0.0.0 --port 8000 --backend pytorch --config trtllm-config.yaml
