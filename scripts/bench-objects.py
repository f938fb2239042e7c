#!/usr/bin/env python3
"""Generates the benchmark cluster: N Ingresses (class haproxy), each routing one host to its own
Service, with one EndpointSlice of three ready endpoints per Service, spread over 50 namespaces.

    scripts/bench-objects.py N > objects.yaml
"""
import sys

n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    ns = f"ns{i % 50}"
    ts = f"2024-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
    addrs = ", ".join(
        f'"10.{(3 * i + k) // 65536 % 256}.{(3 * i + k) // 256 % 256}.{(3 * i + k) % 256}"'
        for k in range(3)
    )
    out.write(f"""---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: app{i}, namespace: {ns}, creationTimestamp: "{ts}", resourceVersion: "{i + 1}"}}
spec:
  ingressClassName: haproxy
  rules:
    - host: host{i}.example.com
      http:
        paths:
          - {{path: /, pathType: Prefix, backend: {{service: {{name: svc{i}, port: {{number: 80}}}}}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: svc{i}, namespace: {ns}}}
spec: {{ports: [{{name: http, port: 80, targetPort: 8080}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc{i}-abc
  namespace: {ns}
  labels: {{kubernetes.io/service-name: svc{i}}}
ports: [{{name: http, port: 8080}}]
endpoints:
  - addresses: [{addrs.split(", ")[0]}]
    conditions: {{ready: true}}
  - addresses: [{addrs.split(", ")[1]}]
    conditions: {{ready: true}}
  - addresses: [{addrs.split(", ")[2]}]
    conditions: {{ready: true}}
""")
