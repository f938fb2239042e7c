#!/usr/bin/env python3
"""Generates the benchmark cluster: N Ingresses (class haproxy), each routing one host to its own
Service, with one EndpointSlice of three ready endpoints per Service, spread over 50 namespaces, plus the default TLS certificate.

    scripts/bench-objects.py N > objects.yaml
"""
import sys

n = int(sys.argv[1])
out = sys.stdout
# The default certificate the chart installs (a self-signed test certificate).
out.write(f"""---
apiVersion: v1
kind: Secret
type: kubernetes.io/tls
metadata: {{name: default-ssl-cert, namespace: default}}
data:
  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJxVENDQVZDZ0F3SUJBZ0lVSVJEeU5ITXZPa0YyWDZsUDBvQkEydnRDd2VZd0NnWUlLb1pJemowRUF3SXcKRmpFVU1CSUdBMVVFQXd3TGMyVmpkWEpsTG5SbGMzUXdJQmNOTWpZeE1qQXlNakF3T1RBNFdoZ1BNakV5TmpFeApNRGd5TURBNU1EaGFNQll4RkRBU0JnTlZCQU1NQzNObFkzVnlaUzUwWlhOME1Ga3dFd1lIS29aSXpqMENBUVlJCktvWkl6ajBEQVFjRFFnQUVoeDdNcEVtdmpXS1hOSlBTVUNIajZhcHdIQ2RQUzF3b3Z0UFZGRm9ZcE1UL0lMV2QKRURTMUlCYVkvYllXU0RLTDduWUR0SjBYRm9OeFkxZkdRbEdSZ2FONk1IZ3dIUVlEVlIwT0JCWUVGUFpoOTAvQgpEa2gxWnpFRnRpTkc4WFpXc0puMU1COEdBMVVkSXdRWU1CYUFGUFpoOTAvQkRraDFaekVGdGlORzhYWldzSm4xCk1BOEdBMVVkRXdFQi93UUZNQU1CQWY4d0pRWURWUjBSQkI0d0hJSUxjMlZqZFhKbExuUmxjM1NDRFNvdWMyVmoKZFhKbExuUmxjM1F3Q2dZSUtvWkl6ajBFQXdJRFJ3QXdSQUlnV1VkOGVWUC9tZ0dia3drTXZjcmlhY2FNY2xZMgp0VlFUSHZteWluMEFDODhDSURyV1lpMkx4cG9nVEQwY3ZQS0xuaUxQRlpXNkN1MXBDSG9HcThaSGZKZmcKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JR0hBZ0VBTUJNR0J5cUdTTTQ5QWdFR0NDcUdTTTQ5QXdFSEJHMHdhd0lCQVFRZ1NyZzk1UVdOY2FpNnpFMXcKTis3NXFILzVqWDAwMHJWSnFhbWtQcWxhVVFHaFJBTkNBQVNISHN5a1NhK05ZcGMwazlKUUllUHBxbkFjSjA5TApYQ2krMDlVVVdoaWt4UDhndFowUU5MVWdGcGo5dGhaSU1vdnVkZ08wblJjV2czRmpWOFpDVVpHQgotLS0tLUVORCBQUklWQVRFIEtFWS0tLS0tCg==
""")
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
