"""A gRPC echo server and client for the GRPCRoute traffic tests (grpcio, no protobuf).

    grpc_echo.py server NAME          serves every method on 127.0.0.1 (a free port, printed
                                      on the first line); each answer is "NAME /svc/method payload";
                                      a method whose name ends in "Stream" is server-streaming
                                      and answers three messages "NAME /svc/method payload N"
    grpc_echo.py tls-server NAME CERT KEY
                                      the same over TLS with that certificate and key (PEM files)
                                      (both servers) a method whose name ends in "Meta" answers
                                      "NAME /svc/method payload" then, sorted, the request
                                      metadata entries whose key starts with "x-", as
                                      " KEY=VALUE" each
    grpc_echo.py client TARGET AUTHORITY METHOD PAYLOAD [KEY=VALUE]
                                      one unary call over HTTP/2 cleartext (with one metadata
                                      entry); prints the answer, or "status CODE" when it fails
    grpc_echo.py calls TARGET AUTHORITY METHOD PAYLOAD COUNT [KEY=VALUE]
                                      COUNT unary calls on one HTTP/2 cleartext connection;
                                      prints one line per call: the answer, then " |", then
                                      the response's initial metadata entries whose key starts
                                      with "x-", sorted, as " KEY=VALUE" each (or "status CODE
                                      |" when the call fails)
    grpc_echo.py tls-call TARGET AUTHORITY CAFILE METHOD PAYLOAD
    grpc_echo.py tls-stream TARGET AUTHORITY CAFILE METHOD PAYLOAD
                                      one unary or server-streaming call over TLS (ALPN h2),
                                      AUTHORITY as SNI and :authority, the server certificate
                                      verified against CAFILE; prints each answer on its own
                                      line, or "status CODE" when it fails
"""
import sys
from concurrent import futures

import grpc


def serve(name, cert=None, key=None):
    class Echo(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            def answer(request, context):
                return f"{name} {method} ".encode() + request

            def answer_meta(request, context):
                meta = sorted(f" {k}={v}" for k, v in context.invocation_metadata() if k.startswith("x-"))
                return f"{name} {method} ".encode() + request + "".join(meta).encode()

            def answers(request, context):
                for i in range(3):
                    yield f"{name} {method} ".encode() + request + f" {i}".encode()

            if method.endswith("Stream"):
                return grpc.unary_stream_rpc_method_handler(answers)
            if method.endswith("Meta"):
                return grpc.unary_unary_rpc_method_handler(answer_meta)
            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Echo(),))
    if cert:
        with open(cert, "rb") as c, open(key, "rb") as k:
            credentials = grpc.ssl_server_credentials(((k.read(), c.read()),))
        port = server.add_secure_port("127.0.0.1:0", credentials)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    # Ends when the test closes stdin (or dies: the pipe closes).
    sys.stdin.read()
    server.stop(0)


def call(target, authority, method, payload, metadata=None):
    options = [("grpc.default_authority", authority)]
    extra = [tuple(metadata.split("=", 1))] if metadata else None
    with grpc.insecure_channel(target, options=options) as channel:
        stub = channel.unary_unary(method)
        try:
            print(stub(payload.encode(), timeout=10, metadata=extra).decode())
        except grpc.RpcError as e:
            print(f"status {e.code().name}")


def calls(target, authority, method, payload, count, metadata=None):
    options = [("grpc.default_authority", authority)]
    extra = [tuple(metadata.split("=", 1))] if metadata else None
    with grpc.insecure_channel(target, options=options) as channel:
        stub = channel.unary_unary(method)
        for _ in range(int(count)):
            try:
                answer, call = stub.with_call(payload.encode(), timeout=10, metadata=extra)
                line = answer.decode()
                meta = call.initial_metadata()
            except grpc.RpcError as e:
                line = f"status {e.code().name}"
                meta = e.initial_metadata() or ()
            sent = sorted(f" {k}={v}" for k, v in meta if k.startswith("x-"))
            print(line + " |" + "".join(sent), flush=True)


def tls_call(streaming, target, authority, cafile, method, payload):
    with open(cafile, "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = [
        ("grpc.default_authority", authority),
        ("grpc.ssl_target_name_override", authority),
    ]
    with grpc.secure_channel(target, credentials, options=options) as channel:
        try:
            if streaming:
                for answer in channel.unary_stream(method)(payload.encode(), timeout=10):
                    print(answer.decode(), flush=True)
            else:
                print(channel.unary_unary(method)(payload.encode(), timeout=10).decode())
        except grpc.RpcError as e:
            print(f"status {e.code().name}")


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2])
    elif sys.argv[1] == "tls-server":
        serve(*sys.argv[2:5])
    elif sys.argv[1] == "calls":
        calls(*sys.argv[2:8])
    elif sys.argv[1] in ("tls-call", "tls-stream"):
        tls_call(sys.argv[1] == "tls-stream", *sys.argv[2:7])
    else:
        call(*sys.argv[2:7])
