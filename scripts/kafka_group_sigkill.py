"""A raw two-member consumer group with one member SIGKILLed, against a Kafka-protocol broker.

Tells apart the broker's group coordinator and babelqueue's transport when a member dies: no
babelqueue code runs here, only confluent-kafka (librdkafka). Two member processes of one
group read a 3-partition topic without committing; when both hold partitions, one is
SIGKILLed, 50 more records are written to each partition, and the survivor is watched for
`session.timeout.ms` + `--wait`: against a broker that evicts the dead member and rebalances,
it ends up owning all 3 partitions and reads the new records of each.

    python kafka_group_sigkill.py --bootstrap 127.0.0.1:9092 [--strategy cooperative-sticky]
        [--runs 3] [--kill first|second]

Prints a timeline (seconds since the kill) and one `result:` line per run; exits 1 if a run
failed. Needs confluent-kafka (the interop venv has it).
"""

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import uuid

N_PER_PARTITION = 50
PARTITIONS = 3


def member(args):
    """One group member: prints its assignment on every change and each record it reads."""
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "client.id": args.name,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "false",
        "session.timeout.ms": str(args.session_ms),
        "heartbeat.interval.ms": str(args.heartbeat_ms),
    }
    if args.strategy:
        conf["partition.assignment.strategy"] = args.strategy
    c = Consumer(conf)

    def out(**kw):
        kw["name"] = args.name
        kw["t"] = time.time()
        print(json.dumps(kw), flush=True)

    def on_assign(consumer, parts):
        out(ev="on_assign", parts=sorted(p.partition for p in parts),
            member_id=consumer.memberid())

    def on_revoke(consumer, parts):
        out(ev="on_revoke", parts=sorted(p.partition for p in parts))

    c.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    last = None
    while True:
        m = c.poll(0.1)
        try:
            now = sorted(p.partition for p in c.assignment())
        except Exception:  # noqa: BLE001 - a rebalance in progress
            now = last
        if now != last:
            out(ev="assignment", parts=now)
            last = now
        if m is None or m.error():
            continue
        out(ev="msg", p=m.partition(), o=m.offset())


def create_topic(bootstrap, topic):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(10)


def produce(bootstrap, topic):
    """N_PER_PARTITION records on each partition."""
    from confluent_kafka import Producer

    # One record per batch: tansu 0.6's high watermark is its last batch's base offset + 1.
    p = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0})
    for part in range(PARTITIONS):
        for i in range(N_PER_PARTITION):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part)
            p.flush(10)


class Member:
    def __init__(self, args, group, topic, name):
        cmd = [sys.executable, __file__, "--member", "--bootstrap", args.bootstrap,
               "--group", group, "--topic", topic, "--name", name,
               "--session-ms", str(args.session_ms), "--heartbeat-ms", str(args.heartbeat_ms)]
        if args.strategy:
            cmd += ["--strategy", args.strategy]
        self.name = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.events = []
        self.assignment = None
        self.member_id = None
        self.seen = {p: set() for p in range(PARTITIONS)}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            e = json.loads(line)
            with self.lock:
                if e["ev"] == "msg":
                    self.seen[e["p"]].add(e["o"])
                    continue
                self.events.append(e)
                if e["ev"] == "assignment":
                    self.assignment = e["parts"]
                if e.get("member_id"):
                    self.member_id = e["member_id"]

    def complete(self, from_offset):
        """Whether it read the N_PER_PARTITION records from `from_offset` on every partition."""
        with self.lock:
            return all(
                len([o for o in s if o >= from_offset]) == N_PER_PARTITION
                for s in self.seen.values()
            )

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for(cond, secs):
    end = time.time() + secs
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def one_run(args, run):
    topic = f"sigkill-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(args.bootstrap, topic)
    produce(args.bootstrap, topic)
    first = Member(args, group, topic, "first")
    assert wait_for(lambda: first.assignment == [0, 1, 2], 30), f"first alone: {first.events}"
    second = Member(args, group, topic, "second")
    both = wait_for(
        lambda: first.assignment and second.assignment
        and sorted(first.assignment + second.assignment) == [0, 1, 2], 30)
    assert both, f"never split: first {first.events} second {second.events}"
    # tansu 0.6 makes the first member to join the group's leader: --kill first kills the
    # leader, --kill second a follower.
    victim, survivor = (first, second) if args.kill == "first" else (second, first)
    before = (list(first.assignment), list(second.assignment))
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    killed_at = time.time()
    n_before = len(survivor.events)
    # Records written after the kill (offsets N..2N-1 of each partition): the survivor reads
    # them only from the partitions it owns.
    produce(args.bootstrap, topic)
    ok = wait_for(
        lambda: survivor.assignment == [0, 1, 2] and survivor.complete(N_PER_PARTITION),
        args.session_ms / 1000 + args.wait)
    with survivor.lock:
        after = survivor.events[n_before:]
        seen = {p: len([o for o in s if o >= N_PER_PARTITION])
                for p, s in survivor.seen.items()}
    print(f"--- run {run}: strategy={args.strategy or 'default (range,roundrobin)'} "
          f"killed={victim.name} before first={before[0]} second={before[1]}")
    for e in after:
        print(f"  +{e['t'] - killed_at:6.2f}s {survivor.name}: {e['ev']} {e.get('parts')}")
    print(f"result: run={run} ok={ok} survivor={survivor.name} "
          f"final_assignment={survivor.assignment} "
          f"records_written_after_the_kill_read_per_partition={seen} of {N_PER_PARTITION}")
    first.stop()
    second.stop()
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--strategy", default="")
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=500)
    ap.add_argument("--wait", type=float, default=20.0, help="seconds past session.timeout.ms")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--kill", choices=["first", "second"], default="second")
    ap.add_argument("--member", action="store_true")
    ap.add_argument("--group")
    ap.add_argument("--topic")
    ap.add_argument("--name")
    args = ap.parse_args()
    if args.member:
        member(args)
        return 0
    oks = [one_run(args, r + 1) for r in range(args.runs)]
    print(f"summary: {sum(oks)} of {len(oks)} runs ok")
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
