#!/usr/bin/env python3
"""Client of bench/server.py: wait for /health, ask /generate once, print the
answer as JSON on stdout. Exit 1 on any failure (a line on stderr).

    client.py --port 18080                      # {"tokens": [...], "seconds": ..., ...}
    client.py --port 18080 --exec -- CMD ARGS   # time CMD + the wait for the first answer
    client.py --port 18080 --stream --exec -- CMD   # ... to the first token of a streamed answer

With --exec it notes the time, runs CMD (stdout captured; JSON if it parses,
stderr passed through), and as soon as CMD has succeeded waits for the server
and asks /generate. It prints
    {"t0": unix time before CMD, "cmd_s": CMD's run time,
     "first_token_s": from t0 to the first /generate answer (--stream: to its
                      first token; "full_answer_s": to the whole answer),
     "cmd_output": CMD's stdout (parsed JSON or text), "answer": the server's answer}
If CMD's output is JSON with a "pid" (as `gpusnap --json run|restore` prints),
the wait gives up as soon as that process is gone, instead of at the timeout.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import time


class Failure(Exception):
    pass


def alive(pid):
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def request(host, port, method, path, body=None, timeout=600.0):
    """One request on its own connection. Returns (status, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Connection": "close"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_health(host, port, deadline, watch_pid=None, interval=0.01):
    """Polls /health until it answers 200. Connection errors are retried
    (the server is not listening yet); Failure at the deadline or when the
    watched process is gone."""
    last = "no answer"
    while True:
        try:
            status, body = request(host, port, "GET", "/health", timeout=max(1.0, min(30.0, deadline - time.time())))
            if status == 200:
                return
            last = f"HTTP {status} {body[:200]!r}"
        except (OSError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {e}"
        if watch_pid and not alive(watch_pid):
            raise Failure(f"the server process {watch_pid} is gone (last: {last})")
        if time.time() >= deadline:
            raise Failure(f"no healthy answer from {host}:{port} in time (last: {last})")
        time.sleep(interval)


def generate(host, port, max_new_tokens=None, timeout=600.0):
    body = json.dumps({"max_new_tokens": max_new_tokens}) if max_new_tokens else None
    try:
        status, data = request(host, port, "POST", "/generate", body=body, timeout=timeout)
    except (OSError, http.client.HTTPException) as e:
        raise Failure(f"/generate failed: {type(e).__name__}: {e}")
    if status != 200:
        raise Failure(f"/generate answered HTTP {status}: {data[:500]!r}")
    try:
        ans = json.loads(data)
    except ValueError:
        raise Failure(f"/generate answered no JSON: {data[:500]!r}")
    if not isinstance(ans, dict) or not isinstance(ans.get("tokens"), list):
        raise Failure(f"/generate answered no tokens: {ans!r}")
    return ans


def generate_streamed(host, port, max_new_tokens=None, timeout=600.0):
    """/generate streamed: (the answer, the time its first token arrived)."""
    doc = {"stream": True}
    if max_new_tokens:
        doc["max_new_tokens"] = max_new_tokens
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body=json.dumps(doc),
                     headers={"Connection": "close", "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise Failure(f"/generate answered HTTP {resp.status}: {resp.read()[:500]!r}")
        t_first, ans = None, None
        for line in resp:
            try:
                item = json.loads(line)
            except ValueError:
                raise Failure(f"/generate streamed a line that is not JSON: {line[:200]!r}")
            if isinstance(item, dict) and "token" in item:
                if t_first is None:
                    t_first = time.time()
            elif isinstance(item, dict) and "error" in item:
                raise Failure(f"/generate failed while streaming: {item['error']}")
            else:
                ans = item
    except (OSError, http.client.HTTPException) as e:
        raise Failure(f"/generate failed: {type(e).__name__}: {e}")
    finally:
        conn.close()
    if not isinstance(ans, dict) or not isinstance(ans.get("tokens"), list) or t_first is None:
        raise Failure(f"/generate streamed no tokens and answer: {ans!r}")
    return ans, t_first


def parse_output(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def watched_pid(output):
    if isinstance(output, dict) and isinstance(output.get("pid"), int) and output["pid"] > 0:
        return output["pid"]
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Ask bench/server.py for a generation (optionally timing a command first)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health (from the start)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the server's")
    p.add_argument("--watch-pid", type=int, default=None, help="give up when this process is gone")
    p.add_argument("--health-only", action="store_true", help="only wait for /health")
    p.add_argument("--stream", action="store_true",
                   help="ask for a streamed answer: first_token_s is then its first token's arrival, "
                        "full_answer_s the whole answer's")
    p.add_argument("--exec", dest="exec_", action="store_true",
                   help="the rest of the line (after an optional --) is a command to run and time first")
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = None
    if "--exec" in argv:  # everything after it is the command, whatever it looks like
        i = argv.index("--exec")
        argv, cmd = argv[:i], argv[i + 1:]
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            p.error("--exec needs a command")
    a = p.parse_args(argv)
    a.cmd = cmd
    return a


def main(argv=None):
    a = parse_args(argv)
    try:
        result = None
        t0 = time.time()
        watch = a.watch_pid
        if a.cmd is not None:
            try:
                p = subprocess.run(a.cmd, stdout=subprocess.PIPE, text=True)
            except OSError as e:
                raise Failure(f"cannot run {a.cmd[0]}: {e}")
            t_cmd = time.time()
            if p.returncode != 0:
                raise Failure(f"command failed with status {p.returncode}: {' '.join(a.cmd)}")
            out = parse_output(p.stdout)
            watch = watch or watched_pid(out)
            result = {"t0": t0, "cmd_s": t_cmd - t0, "cmd_output": out}
        wait_health(a.host, a.port, t0 + a.timeout, watch)
        t_first = None
        if a.health_only:
            ans = {"healthy": True}
        elif a.stream:
            t_ask = time.time()
            ans, t_first = generate_streamed(a.host, a.port, a.max_new_tokens, timeout=max(a.timeout, 60.0))
            ans["first_token_after_s"] = t_first - t_ask
        else:
            ans = generate(a.host, a.port, a.max_new_tokens, timeout=max(a.timeout, 60.0))
        t1 = time.time()
        if result is None:
            result = ans
        elif t_first is not None:
            result.update(first_token_s=t_first - t0, full_answer_s=t1 - t0, streamed=True, answer=ans)
        else:
            result.update(first_token_s=t1 - t0, answer=ans)
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
        return 0
    except Failure as e:
        print(f"client: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
