# Submit the script once per replica (1); each job prints
# 'API: http://HOST:PORT' from its first node. Measure every replica with:
specadapt probe --url http://HOST0:8000
