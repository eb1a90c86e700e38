// A 2026-era client on the official TypeScript SDK v2 (@modelcontextprotocol/client, mode 'auto')
// completes a prompt argument and a resource-template argument through graph-os (stdio) whose
// child answers in the 2025 era. Prints one JSON line: {era, prompt, template}.
// Usage: node ts_v2_complete.mjs GRAPH_OS FLEET (TS_MODE=pin: the 2026-07-28 era pinned; else mode 'auto')
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const [graphOs, fleet] = process.argv.slice(2);
const client = new Client({ name: 'ts-v2-complete', version: '0' }, { versionNegotiation: { mode: process.env.TS_MODE === 'pin' ? { pin: '2026-07-28' } : 'auto' } });
await client.connect(new StdioClientTransport({ command: graphOs, args: ['--config', fleet] }));
const deadline = Date.now() + 60_000;
for (;;) {
  const status = await client.callTool({ name: 'multiplexer_status', arguments: {} });
  const tc = status.structuredContent?.children?.tc;
  if (tc && (tc.state === 'up' || tc.state === 'failed')) break;
  if (Date.now() > deadline) throw new Error('the child never settled');
  await new Promise((r) => setTimeout(r, 200));
}
const prompt = await client.complete({
  ref: { type: 'ref/prompt', name: 'tc__greet' },
  argument: { name: 'name', value: 'a' },
});
const templates = await client.listResourceTemplates();
const uri = templates.resourceTemplates.find((t) => t.uriTemplate.endsWith('items/{id}')).uriTemplate;
const template = await client.complete({
  ref: { type: 'ref/resource', uri },
  argument: { name: 'id', value: '4' },
});
console.log(JSON.stringify({
  era: client.getProtocolEra(),
  prompt: prompt.completion.values,
  template: template.completion.values,
}));
await client.close();
