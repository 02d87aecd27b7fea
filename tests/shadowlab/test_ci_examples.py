"""The CI examples in docs/ci/ (docs/sharding.md): they pass their validators offline, and each
job or pod runs the shard its part is named for.

The shard wiring is checked by running each file's own shell script under the shell its runner
uses, with the CI's variables set as GitHub or Kubernetes would set them and a recorder in
place of `shadowlab` on PATH; the recorded command line is then parsed by shadowlab's real
parser and its shard resolved by the real `ShardSpec` (plan/shard.py). So a workflow whose job
names or artifacts say "shard 0" while shadowlab runs shard 1/3, or one that feeds a 1-based
list into a 0-based variable ("shard 4 of 3"), fails here, not on a runner.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowlab import cli
from shadowlab.plan.shard import ShardSpec, ShardUsageError

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "docs" / "ci" / "github-shards.yml"
MANIFEST = REPO / "docs" / "ci" / "k8s-indexed-job.yaml"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"

RECORDER = """\
import json, os, sys
with open(os.environ["RECORDED"], "a", encoding="utf-8") as out:
    out.write(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}) + "\\n")
sys.exit(int(os.environ.get("RECORDED_EXIT_" + sys.argv[1], "0")))
"""


# ---------------------------------------------------------------- validators (offline)


def validator(module: str) -> None:
    """A validator the test extra installs: missing in CI fails (never a silent skip)."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def run_validator(*args: str) -> subprocess.CompletedProcess:
    # No network: both validators read the schemas shipped in their wheels.
    env = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_github_workflow_passes_the_workflow_schema(tmp_path):
    validator("check_jsonschema")
    ok = run_validator("check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"  # the validator catches a job without runs-on
    broken.write_text(WORKFLOW.read_text().replace("    runs-on: ubuntu-24.04\n    timeout-minutes: 20\n",
                                                   "    timeout-minutes: 20\n"))
    bad = run_validator("check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(broken))
    assert bad.returncode == 1 and "'runs-on' is a required property" in bad.stdout


def test_the_kubernetes_manifest_passes_the_kubernetes_schemas(tmp_path):
    validator("kubernetes_validate")
    ok = run_validator("kubernetes_validate", "--strict", str(MANIFEST))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("passed for resource") == 3
    broken = tmp_path / "broken.yaml"  # a misspelt field of the Indexed Job is caught
    broken.write_text(MANIFEST.read_text().replace("backoffLimitPerIndex:", "backoffLimitPerIndx:"))
    bad = run_validator("kubernetes_validate", "--strict", str(broken))
    assert bad.returncode == 1 and "'backoffLimitPerIndx' was unexpected" in bad.stdout + bad.stderr


# ---------------------------------------------------------------- every shadowlab line parses


def _shadowlab_commands(script: str) -> list[list[str]]:
    commands = []
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("shadowlab "):
            line = re.sub(r"\$\{\{[^}]*\}\}", "1", line.split("||")[0].split(";")[0])
            line = re.sub(r"\$\{?[A-Za-z_]\w*\}?", "1", line.replace("$resume", ""))  # any value parses
            commands.append(shlex.split(line)[1:])
    return commands


def _pods(manifest: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc["spec"]["template"]["spec"] for doc in manifest if doc["kind"] == "Job"}


def test_the_ci_files_call_shadowlab_as_its_command_line_parses():
    """Every `shadowlab ...` line of both files is accepted by the real parser, and the files
    fan out, merge, report and gate."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    scripts = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    for pod in _pods(list(yaml.safe_load_all(MANIFEST.read_text()))).values():
        scripts += [a for c in pod.get("containers", []) + pod.get("initContainers", []) for a in c.get("args", [])]
    commands = [c for s in scripts for c in _shadowlab_commands(s)]
    parser = cli.build_parser()
    for command in commands:
        parser.parse_args(command)  # SystemExit(2) on an option shadowlab does not have
    verbs = [c[0] for c in commands]
    assert verbs.count("run") == 2 and verbs.count("merge") == 2 and verbs.count("gate") == 2
    summary = [s for s in workflow["jobs"]["merge"]["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert summary and "report.md" in summary[0]["run"]


# ---------------------------------------------------------------- running the files' scripts


@dataclass(frozen=True)
class Call:
    argv: list[str]
    env: dict[str, str]

    def shard(self) -> ShardSpec:
        """The shard shadowlab runs for this command line in this environment."""
        refused = io.StringIO()
        try:
            with contextlib.redirect_stderr(refused):
                args = cli.build_parser("run").parse_args(self.argv)
        except SystemExit:  # what the CI log would show, e.g. "shard 4 of 3 does not exist"
            raise AssertionError(f"shadowlab {shlex.join(self.argv)}: {refused.getvalue().strip()}") from None
        if args.shard_from is not None:
            try:
                return ShardSpec.from_ci(args.shard_from, self.env, args.shard_count)
            except ShardUsageError as exc:
                raise AssertionError(f"shadowlab {shlex.join(self.argv)}: {exc}") from None
        assert args.shard is not None, f"{self.argv}: runs the whole matrix, not a shard"
        return args.shard

    def option(self, name: str) -> str:
        return self.argv[self.argv.index(name) + 1]


def run_script(tmp_path: Path, shell: list[str], script: str, env: dict[str, str],
               exits: dict[str, int] | None = None) -> tuple[subprocess.CompletedProcess, list[Call]]:
    """`script` run by `shell` in tmp_path with `shadowlab` recorded, not run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder = bin_dir / "shadowlab"
    recorder.write_text(f"#!{sys.executable}\n{RECORDER}")
    recorder.chmod(0o755)
    recorded = tmp_path / "recorded.jsonl"
    recorded.unlink(missing_ok=True)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORDED": str(recorded), **env,
            **{f"RECORDED_EXIT_{verb}": str(code) for verb, code in (exits or {}).items()}}
    done = subprocess.run([*shell, script], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)
    lines = recorded.read_text().splitlines() if recorded.exists() else []
    return done, [Call(**json.loads(line)) for line in lines]


# ---------------------------------------------------------------- GitHub: the shard each job runs


GITHUB_CONTEXT = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _expand(text: str, context: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in context, f"the shard job uses ${{{{ {name} }}}}, which this test cannot evaluate"
        return context[name]
    return GITHUB_CONTEXT.sub(value, text)


@dataclass(frozen=True)
class GithubJob:
    name: str
    call: Call
    artifact: dict[str, str]


def github_shard_jobs(text: str, tmp_path: Path) -> list[GithubJob]:
    """Each job of the workflow's `shard` fan-out as GitHub would start it: its matrix entry,
    `strategy.job-index` (0-based, in matrix order) and `job-total`, its shard step run by bash."""
    workflow = yaml.safe_load(text)
    job = workflow["jobs"]["shard"]
    axes = job["strategy"]["matrix"]
    entries = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    jobs = []
    for index, entry in enumerate(entries):
        context = {f"matrix.{k}": str(v) for k, v in entry.items()}
        context |= {"strategy.job-index": str(index), "strategy.job-total": str(len(entries))}
        step = next(s for s in job["steps"] if "shadowlab run" in s.get("run", ""))
        env = {k: _expand(str(v), context) for k, v in {**workflow.get("env", {}), **step.get("env", {})}.items()}
        done, calls = run_script(tmp_path, ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"],
                                 _expand(step["run"], context), env)
        assert done.returncode == 0 and len(calls) == 1, done.stderr
        upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
        jobs.append(GithubJob(_expand(job["name"], context), calls[0],
                              {k: _expand(str(v), context) for k, v in upload["with"].items()}))
    return jobs


def check_github_shards(jobs: list[GithubJob]) -> None:
    """The fan-out runs shards 1..N of N once each, and every job is named, writes and uploads its
    part under the number shadowlab gives its shard."""
    specs = [job.call.shard() for job in jobs]
    assert sorted(s.index for s in specs) == list(range(1, len(jobs) + 1)), specs
    assert {s.count for s in specs} == {len(jobs)}, specs
    for job, spec in zip(jobs, specs):
        assert re.search(rf"\bshard {spec.index}\b", job.name), f"job {job.name!r} runs shard {spec}"
        assert job.call.option("--out") == job.artifact["path"], (job.call.argv, job.artifact)
        assert re.search(rf"\D{spec.index}$", job.artifact["name"]), f"artifact {job.artifact['name']!r} of shard {spec}"
    assert len({job.artifact["name"] for job in jobs}) == len(jobs)


def test_each_github_shard_job_runs_the_shard_it_is_named_for(tmp_path):
    jobs = github_shard_jobs(WORKFLOW.read_text(), tmp_path)
    assert len(jobs) == 3
    check_github_shards(jobs)


def test_the_github_shard_list_alone_sets_the_fan_out(tmp_path):
    five = WORKFLOW.read_text().replace("shard: [1, 2, 3]", "shard: [1, 2, 3, 4, 5]")
    jobs = github_shard_jobs(five, tmp_path)
    assert len(jobs) == 5
    check_github_shards(jobs)


def test_a_github_shard_index_off_by_one_is_caught(tmp_path):
    """The job index is 0-based, shadowlab's shards 1-based: feeding it in is shard 0 of 3."""
    off = WORKFLOW.read_text().replace("SHARD: ${{ matrix.shard }}", "SHARD: ${{ strategy.job-index }}")
    assert off != WORKFLOW.read_text()
    with pytest.raises(AssertionError, match="shard 0 of 3 does not exist"):
        check_github_shards(github_shard_jobs(off, tmp_path))


def test_the_github_jobs_install_cpu_torch_with_a_pip_cache():
    """A stock runner would fetch the CUDA build from PyPI; the CPU index has the README's torch."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    readme_torch = re.search(r"^pip install (torch==\S+) && pip install -e '\.\[engine\]' && shadowlab run",
                             (REPO / "README.md").read_text(), re.M)
    assert readme_torch
    install = workflow["env"]["PIP_INSTALL"]
    assert install.startswith(f"pip install {readme_torch.group(1)} {CPU_INDEX} && "), install
    for name, job in workflow["jobs"].items():
        setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python"))
        assert setup["with"].get("cache") == "pip", name
        assert any("$PIP_INSTALL" in s.get("run", "") for s in job["steps"]), name
    assert CPU_INDEX in MANIFEST.read_text()


# ---------------------------------------------------------------- Kubernetes


def _manifest(text: str | None = None) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(text or MANIFEST.read_text())}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _script(container: dict[str, Any], parts: Path) -> str:
    assert container["command"] == ["/bin/sh", "-c"]
    return container["args"][0].replace("/parts", str(parts))


def kubernetes_shard_pods(text: str, tmp_path: Path) -> tuple[int, list[Call]]:
    """The Indexed Job's pods as Kubernetes starts them (JOB_COMPLETION_INDEX 0..completions-1,
    parallelism at a time), each one's script run by /bin/sh: (completions, the runs)."""
    shards = _manifest(text)["shadowlab-shards"]
    assert shards["spec"]["completionMode"] == "Indexed"
    count = shards["spec"]["completions"]
    container = _container(shards)
    parts = tmp_path / "parts"
    parts.mkdir(exist_ok=True)
    calls = []
    for index in range(count):
        env = {**_env(container), "JOB_COMPLETION_INDEX": str(index)}
        done, ran = run_script(tmp_path, ["/bin/sh", "-c"], _script(container, parts), env)
        assert done.returncode == 0 and len(ran) == 1, done.stderr
        spec = ran[0].shard()
        assert ran[0].option("--out") == str(parts / f"shard-{spec.index}"), f"pod {index} runs shard {spec}"
        assert (parts / f"shard-{spec.index}.done").exists()
        assert (parts / "shard-count").read_text().strip() == str(spec.count)  # what the merge reads
        calls += ran
    assert shards["spec"]["parallelism"] == count
    return count, calls


def check_kubernetes_shards(count: int, calls: list[Call]) -> None:
    specs = [call.shard() for call in calls]
    assert sorted(s.index for s in specs) == list(range(1, count + 1)), specs
    assert {s.count for s in specs} == {count}, f"{count} pods run shards {[str(s) for s in specs]}"


def test_each_kubernetes_pod_runs_the_shard_its_part_is_named_for(tmp_path):
    count, calls = kubernetes_shard_pods(MANIFEST.read_text(), tmp_path)
    assert count == 3
    check_kubernetes_shards(count, calls)


def test_a_kubernetes_shard_count_changed_in_one_place_only_is_caught(tmp_path):
    """completions is the count; the pods' SHADOWLAB_SHARD_COUNT must say the same (the fourth
    pod would be refused on the cluster: JOB_COMPLETION_INDEX=3 is shard 4 of 3)."""
    four = MANIFEST.read_text().replace("completions: &shards 3", "completions: &shards 4")
    with pytest.raises(AssertionError, match="shard 4 of 3 does not exist"):
        check_kubernetes_shards(*kubernetes_shard_pods(four, tmp_path))


def test_a_kubernetes_pod_that_could_not_finish_its_part_marks_nothing_done(tmp_path):
    container = _container(_manifest()["shadowlab-shards"])
    parts = tmp_path / "parts"
    parts.mkdir()
    env = {**_env(container), "JOB_COMPLETION_INDEX": "1"}
    done, _ = run_script(tmp_path, ["/bin/sh", "-c"], _script(container, parts), env, exits={"run": 130})
    assert done.returncode == 130 and not (parts / "shard-2.done").exists()  # retried, then resumed
    done, _ = run_script(tmp_path, ["/bin/sh", "-c"], _script(container, parts), env, exits={"run": 3})
    assert done.returncode == 0 and (parts / "shard-2.done").exists()  # complete: the gate judges the cell


def _merge_run(tmp_path: Path, finished: list[int], wait_s: str, merge_exit: int = 0, count: int = 3):
    container = _container(_manifest()["shadowlab-merge"])
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "shard-count").write_text(f"{count}\n")  # written by the shard pods
    for index in finished:
        (parts / f"shard-{index}").mkdir()
        (parts / f"shard-{index}.done").touch()
    env = {**_env(container), "WAIT_S": wait_s}
    return parts, *run_script(tmp_path, ["/bin/sh", "-c"], _script(container, parts), env,
                              exits={"merge": merge_exit})


def test_the_kubernetes_merge_stops_waiting_at_its_deadline_and_merge_names_the_missing_shard(tmp_path):
    """Shard 2 exhausted its retries: at the deadline the merge runs on what is there, so
    `shadowlab merge` names shard 2 and its cells (test_merge.py) and the Job fails with its exit."""
    parts, done, calls = _merge_run(tmp_path, [1, 3], wait_s="0", merge_exit=2)
    assert done.returncode == 2
    assert "2 of 3 shard(s) finished" in done.stderr
    assert [c.argv for c in calls] == [["merge", f"{parts}/shard-1/", f"{parts}/shard-3/", "--out", f"{parts}/merged"]]


def test_the_kubernetes_merge_merges_reports_and_gates_once_every_shard_is_done(tmp_path):
    parts, done, calls = _merge_run(tmp_path, [1, 2, 3], wait_s="86400")  # no wait: all are done
    assert done.returncode == 0 and "waited" not in done.stderr
    assert [c.argv[0] for c in calls] == ["merge", "report", "gate"]


def test_the_kubernetes_merge_takes_the_count_from_the_parts(tmp_path):
    """Four shards written by the pods: three done is not all, whatever the manifest says."""
    _, done, calls = _merge_run(tmp_path, [1, 2, 3], wait_s="0", count=4)
    assert "3 of 4 shard(s) finished" in done.stderr and calls[0].argv[0] == "merge"


def test_the_kubernetes_deadlines_nest():
    """The merge waits longer than any shard pod may run, and its Job outlives that wait."""
    manifest = _manifest()
    shards_deadline = manifest["shadowlab-shards"]["spec"]["activeDeadlineSeconds"]
    wait_s = int(_env(_container(manifest["shadowlab-merge"]))["WAIT_S"])
    assert shards_deadline < wait_s < manifest["shadowlab-merge"]["spec"]["activeDeadlineSeconds"]


def test_the_kubernetes_images_are_pinned_and_the_leases_shared_on_the_node():
    images = {c["image"] for job in _manifest().values() if job["kind"] == "Job"
              for c in job["spec"]["template"]["spec"]["containers"]}
    assert len(images) == 1 and re.fullmatch(r"[^:@\s]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", images.pop())
    shards = _manifest()["shadowlab-shards"]
    container = _container(shards)
    lock_dir = _env(container)["SHADOWLAB_LOCK_DIR"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == lock_dir)
    volume = next(v for v in shards["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert "hostPath" in volume and not lock_dir.startswith("/tmp")
