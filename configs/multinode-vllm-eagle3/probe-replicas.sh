# Measure every replica; from a pod inside the cluster:
specadapt probe --url http://vllm-eagle3-leader-0.default.svc.cluster.local:8000 --url http://vllm-eagle3-leader-1.default.svc.cluster.local:8000
# or from your machine, through port-forwards:
kubectl -n default port-forward svc/vllm-eagle3-leader-0 18000:8000 & kubectl -n default port-forward svc/vllm-eagle3-leader-1 18001:8000 &
specadapt probe --url http://localhost:18000 --url http://localhost:18001
