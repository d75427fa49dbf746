#!/usr/bin/env bash
# Refreshes the playground's vendored files in vendor/ from web/node_modules:
# GraphiQL's prebuilt bundle and stylesheet, React's and ReactDOM's UMD
# production builds, the three packages' licenses, and the licenses of the
# packages GraphiQL's bundle is built from. Nothing is built here: these are
# the files the packages publish, copied as they are.
#
# Run it from anywhere after `npm ci` in web/. To move to other versions,
# change the pins first, e.g.
#   (cd web && npm install --save-dev --save-exact graphiql@3.9.0 react@18.3.1 react-dom@18.3.1)
# then run this, update the table in README.md, and run the playground tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
web=$(dirname "$here")
modules="$web/node_modules"
vendor="$here/vendor"

for pkg in graphiql react react-dom; do
  if [ ! -f "$modules/$pkg/package.json" ]; then
    echo "update.sh: $modules/$pkg is missing; run npm ci in $web first" >&2
    exit 1
  fi
done

rm -rf "$vendor"
mkdir -p "$vendor"
cp "$modules/graphiql/graphiql.min.js" "$modules/graphiql/graphiql.min.css" "$vendor/"
cp "$modules/react/umd/react.production.min.js" "$vendor/"
cp "$modules/react-dom/umd/react-dom.production.min.js" "$vendor/"
for pkg in graphiql react react-dom; do
  cp "$modules/$pkg/LICENSE" "$vendor/LICENSE-$pkg.txt"
done

# graphiql.min.js bundles GraphiQL's dependencies (all but React and
# ReactDOM, which it takes from the page). Their licenses ask to travel with
# them, so collect each one from the dependency tree npm installed.
(cd "$web" && npm query '#graphiql *') | node --input-type=module -e '
import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
const nodes = JSON.parse(readFileSync(0, "utf8"));
const seen = new Map();
for (const node of nodes) {
  // Type declarations are not code and are not in the bundle.
  if (node.name.startsWith("@types/")) continue;
  seen.set(`${node.name}@${node.version}`, node);
}
const out = [
  "Licenses of the packages graphiql.min.js is built from, as npm installs them for the",
  "pinned graphiql version (GraphiQL built its bundle from the versions current at its",
  "release, which may differ in patch level). React and ReactDOM have files of their own.",
  "",
];
for (const [id, node] of [...seen].sort(([a], [b]) => a.localeCompare(b))) {
  out.push("=".repeat(78), `${id} (${node.license ?? "no license field"})`, "=".repeat(78));
  const files = readdirSync(node.path).filter((f) => /^(licen[cs]e|copying|notice)(\.|-|$)/i.test(f));
  if (!files.length) out.push(`The package has no license file; its package.json says: ${node.license}.`);
  for (const file of files) out.push(readFileSync(path.join(node.path, file), "utf8").trimEnd());
  out.push("");
}
process.stdout.write(out.join("\n"));
' > "$vendor/THIRD-PARTY-NOTICES.txt"

echo "vendored into $vendor:"
for pkg in graphiql react react-dom; do
  node -e 'const p = require(process.argv[1]); console.log(`  ${p.name} ${p.version}`)' "$modules/$pkg/package.json"
done
ls -l "$vendor"
