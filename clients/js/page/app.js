// The page's script: opens the replica kept in IndexedDB, pulls from the gateway the query string
// names, shows what it holds, and offers window.app to the browser test.
import { BrowserReplica } from "../dist/browser.js";

const query = new URLSearchParams(location.search);
const lines = [];
function log(line) {
  lines.push(`${new Date().toISOString().slice(11, 23)} ${line}`);
  if (lines.length > 200) lines.shift();
  document.getElementById("log").textContent = lines.slice(-12).join("\n");
  console.log(line);
}

function render(replica) {
  const state = replica.replica.state();
  const held = replica.replica.heldRows();
  document.getElementById("position").textContent =
    `generation ${state.gen}, message ${state.seq}, ${held.length} rows held`;
  const body = document.querySelector("#rows tbody");
  body.replaceChildren(
    ...held.slice(0, 40).map((row) => {
      const tr = document.createElement("tr");
      for (const text of [row.t, row.k, row.r, row.scope]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      return tr;
    }),
  );
}

async function main() {
  const replica = await BrowserReplica.open({
    id: query.get("replica"),
    sqlJsDirectory: new URL("../node_modules/sql.js/dist/", location.href).href,
  });
  replica.start(
    query.get("gateway"),
    query.get("token"),
    (line) => {
      log(line);
      render(replica);
    },
    1000,
    query.get("gzip-up") === "1",
  );
  render(replica);
  document.getElementById("status").textContent = "pulling from " + query.get("gateway");
  return {
    // "table key h" per held row, the server's rows as stored
    held: () => replica.replica.heldRows().map((row) => `${row.t} ${row.k} ${row.h}`),
    show: () => JSON.parse(replica.replica.showJson()),
    write: async (table, row, key) => {
      await replica.write(table, row, key);
      render(replica);
    },
    log: () => lines.join("\n"),
  };
}

window.app = main().catch((error) => {
  document.getElementById("status").textContent = `failed: ${error}`;
  console.error(`${error}\n${error.stack}`);
  throw error;
});
