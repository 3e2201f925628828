#!/usr/bin/env bash
# Installs, builds, packs and tests @fencelock/client.
#
#   clients/node/test.sh
#
# The real-cluster tests need a fencelock binary: $FENCELOCK_BIN, else
# $CARGO_TARGET_DIR/debug/fencelock, else /work/main/target/debug/fencelock,
# else ~/.cache/fencelock/target/debug/fencelock. Without one they are
# skipped with a message; FENCELOCK_REQUIRE_CLUSTER=1 makes that a failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v node >/dev/null; then
  echo "node is missing: apt-get install -y nodejs npm" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  echo "Node.js >= 20 is needed (found $(node --version))" >&2
  exit 1
fi

echo "== npm ci"
npm ci --no-audit --no-fund --loglevel=error
echo "== build"
npm run --silent build
echo "== type-check the public API as a TypeScript user sees it"
npx --no-install tsc -p test/tsconfig.json

echo "== npm pack, and install the tarball into an empty project"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
tarball="$(npm pack --silent --pack-destination "$scratch" | tail -n 1)"
listing="$(tar -tzf "$scratch/$tarball")"
grep -qx 'package/dist/index.js' <<<"$listing"
grep -qx 'package/proto/fencelock/v1/lock.proto' <<<"$listing"
if grep -qE '^package/(src|test|node_modules)/' <<<"$listing"; then
  echo "the tarball carries sources, tests or node_modules" >&2
  exit 1
fi
mkdir "$scratch/app"
(
  cd "$scratch/app"
  npm init -y >/dev/null
  npm install --no-audit --no-fund --loglevel=error "$scratch/$tarball"
  node --input-type=module -e '
    import { Client, FencelockError } from "@fencelock/client";
    const c = new Client(["127.0.0.1:1"], { callTimeoutMs: 200 });
    const e = await c.lock("acme/x").catch((e) => e);
    if (!(e instanceof FencelockError) || e.code !== "UNAVAILABLE") throw new Error("unexpected: " + e);
    await c.close();
    console.log("installed tarball works:", e.code);
  '
)

echo "== unit tests (fakes) and real-cluster tests"
node --test --test-timeout=120000 test/*.test.mjs
