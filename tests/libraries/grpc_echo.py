"""A gRPC echo server and client for the GRPCRoute traffic test (grpcio, no protobuf).

    grpc_echo.py server NAME          serves every method on 127.0.0.1 (a free port, printed
                                      on the first line); each answer is "NAME /svc/method payload"
    grpc_echo.py client TARGET AUTHORITY METHOD PAYLOAD [KEY=VALUE]
                                      one unary call over HTTP/2 cleartext (with one metadata
                                      entry); prints the answer, or "status CODE" when it fails
"""
import sys
from concurrent import futures

import grpc


def serve(name):
    class Echo(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            def answer(request, context):
                return f"{name} {method} ".encode() + request

            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Echo(),))
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


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2])
    else:
        call(*sys.argv[2:7])
