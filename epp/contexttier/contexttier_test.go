package contexttier

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend"
	backendmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/plugins"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/framework"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/framework/plugins/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/framework/plugins/profile"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/types"
)

// pod is a serving endpoint; maxContext "" leaves the label off.
func pod(name, maxContext string) types.Pod {
	labels := map[string]string{"app": "fleet"}
	if maxContext != "" {
		labels[DefaultLabel] = maxContext
	}
	return &types.PodMetrics{
		Pod: &backend.Pod{
			NamespacedName: k8stypes.NamespacedName{Namespace: "ns", Name: name},
			Address:        "127.0.0.1",
			Labels:         labels,
		},
		MetricsState: backendmetrics.NewMetricsState(),
	}
}

func names(pods []types.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.GetPod().NamespacedName.Name)
	}
	sort.Strings(out)
	return out
}

func chat(text string) *types.LLMRequest {
	return &types.LLMRequest{Body: &types.LLMRequestBody{ChatCompletions: &types.ChatCompletionsRequest{
		Messages: []types.Message{{Role: "user", Content: types.Content{Raw: text}}},
	}}}
}

func completion(prompt string) *types.LLMRequest {
	return &types.LLMRequest{Body: &types.LLMRequestBody{Completions: &types.CompletionsRequest{Prompt: prompt}}}
}

func mustNew(t *testing.T, parameters Parameters) *Filter {
	t.Helper()
	filter, err := New(parameters)
	if err != nil {
		t.Fatalf("New(%+v): %v", parameters, err)
	}
	return filter
}

func TestSmallestFittingTierIsKept(t *testing.T) {
	pods := []types.Pod{pod("short-0", "32768"), pod("short-1", "32768"), pod("long-0", "1048576")}
	filter := mustNew(t, Parameters{BytesPerToken: 4})

	cases := []struct {
		name    string
		request *types.LLMRequest
		want    []string
	}{
		{"short chat prompt", chat("hello"), []string{"short-0", "short-1"}},
		// 200k bytes / 4 = 50k tokens: past the 32k tier, within the 1M tier.
		{"long chat prompt", chat(strings.Repeat("x", 200_000)), []string{"long-0"}},
		{"long completion prompt", completion(strings.Repeat("y", 200_000)), []string{"long-0"}},
		// 4 * (32768 - 8 overhead) - 4 bytes of role = the largest prompt that still fits the short tier.
		{"prompt at the boundary", chat(strings.Repeat("z", 4*(32768-8)-4)), []string{"short-0", "short-1"}},
		{"prompt one token past the boundary", chat(strings.Repeat("z", 4*(32768-8)-4+1)), []string{"long-0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := names(filter.Filter(context.Background(), nil, tc.request, pods))
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("kept %v, want %v (estimate %d tokens)", got, tc.want, filter.EstimateTokens(tc.request))
			}
		})
	}
}

func TestLargestTierWhenNoneFits(t *testing.T) {
	pods := []types.Pod{pod("short-0", "1000"), pod("mid-0", "2000"), pod("mid-1", "2000")}
	got := names(mustNew(t, Parameters{}).Filter(context.Background(), nil, completion(strings.Repeat("a", 100_000)), pods))
	if strings.Join(got, ",") != "mid-0,mid-1" {
		t.Fatalf("kept %v, want the largest tier mid-0,mid-1", got)
	}
}

func TestFleetWithoutTiersPassesThrough(t *testing.T) {
	pods := []types.Pod{pod("a", ""), pod("b", "")}
	got := mustNew(t, Parameters{}).Filter(context.Background(), nil, chat(strings.Repeat("a", 1_000_000)), pods)
	if len(got) != 2 {
		t.Fatalf("kept %v, want both unlabelled pods", names(got))
	}
}

func TestUnlabelledAndInvalidPodsAreDroppedWhenTiersExist(t *testing.T) {
	pods := []types.Pod{pod("tiered", "4096"), pod("unlabelled", ""), pod("garbage", "lots"), pod("zero", "0")}
	got := names(mustNew(t, Parameters{}).Filter(context.Background(), nil, chat("hi"), pods))
	if strings.Join(got, ",") != "tiered" {
		t.Fatalf("kept %v, want only the labelled pod", got)
	}
}

func TestEmptyInputStaysEmpty(t *testing.T) {
	if got := mustNew(t, Parameters{}).Filter(context.Background(), nil, chat("hi"), nil); len(got) != 0 {
		t.Fatalf("kept %v from no pods", names(got))
	}
}

func TestCustomLabel(t *testing.T) {
	short := pod("short", "")
	short.GetPod().Labels["example.com/ctx"] = "100"
	long := pod("long", "")
	long.GetPod().Labels["example.com/ctx"] = "100000"
	filter := mustNew(t, Parameters{Label: "example.com/ctx"})
	got := names(filter.Filter(context.Background(), nil, chat(strings.Repeat("b", 3000)), []types.Pod{short, long}))
	if strings.Join(got, ",") != "long" {
		t.Fatalf("kept %v, want long", got)
	}
}

func TestEstimateCountsWhatTheEngineTokenizes(t *testing.T) {
	filter := mustNew(t, Parameters{BytesPerToken: 1})
	plain := filter.EstimateTokens(chat("abcd"))
	if plain != int64(len("user")+len("abcd")+messageOverheadTokens) {
		t.Fatalf("plain chat estimate %d", plain)
	}
	structured := &types.LLMRequest{Body: &types.LLMRequestBody{ChatCompletions: &types.ChatCompletionsRequest{
		Messages: []types.Message{
			{Role: "system", Content: types.Content{Raw: "be brief"}},
			{Role: "user", Content: types.Content{Structured: []types.ContentBlock{{Type: "text", Text: "abc"}}}},
		},
		Tools: []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}},
	}}}
	toolBytes, _ := json.Marshal(structured.Body.ChatCompletions.Tools)
	// PlainText of a structured message appends a space after each text block.
	want := int64(len("system")+len("be brief")+len("user")+len("abc ")+len(toolBytes)) + 2*messageOverheadTokens
	if got := filter.EstimateTokens(structured); got != want {
		t.Fatalf("structured chat estimate %d, want %d", got, want)
	}
	if got := filter.EstimateTokens(&types.LLMRequest{}); got != 0 {
		t.Fatalf("request without a body estimated at %d tokens", got)
	}
	// Multi-byte text counts its UTF-8 bytes: 3 per CJK character.
	if got := filter.EstimateTokens(completion("模型")); got != 6 {
		t.Fatalf("CJK estimate %d, want 6", got)
	}
}

func TestParameters(t *testing.T) {
	if _, err := Factory("tier", json.RawMessage(`{"bytesPerToken": -1}`), nil); err == nil ||
		!strings.Contains(err.Error(), "bytesPerToken must be a positive number") {
		t.Fatalf("negative bytesPerToken: %v", err)
	}
	if _, err := Factory("tier", json.RawMessage(`{"bytesPerTokens": 2}`), nil); err == nil ||
		!strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("misspelt parameter: %v", err)
	}
	plugin, err := Factory("my-tier", json.RawMessage(`{"bytesPerToken": 2.5, "label": "x/y"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	filter := plugin.(*Filter)
	if filter.TypedName() != (plugins.TypedName{Type: Type, Name: "my-tier"}) || filter.bytesPerToken != 2.5 || filter.label != "x/y" {
		t.Fatalf("factory built %+v", filter)
	}
	defaulted, err := Factory("tier", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := defaulted.(*Filter); d.bytesPerToken != DefaultBytesPerToken || d.label != DefaultLabel {
		t.Fatalf("defaults not applied: %+v", d)
	}
}

// TestLoadsFromEndpointPickerConfig runs the upstream config loader on the config the operator renders, so a
// registration or type-name mistake fails here and not in a cluster.
func TestLoadsFromEndpointPickerConfig(t *testing.T) {
	plugins.Register(Type, Factory)
	// The defaults the loader adds (upstream's runner registers them with the other in-tree plugins).
	plugins.Register(profile.SingleProfileHandlerType, profile.SingleProfileHandlerFactory)
	plugins.Register(picker.MaxScorePickerType, picker.MaxScorePickerFactory)
	config := `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: m3fleet-context-tier
  parameters:
    bytesPerToken: 3
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: m3fleet-context-tier
`
	raw, _, err := loader.LoadRawConfig([]byte(config), logr.Discard())
	if err != nil {
		t.Fatalf("LoadRawConfig: %v", err)
	}
	handle := plugins.NewEppHandle(context.Background(), nil)
	if _, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard()); err != nil {
		t.Fatalf("InstantiateAndConfigure: %v", err)
	}
	if _, ok := handle.Plugin(Type).(framework.Filter); !ok {
		t.Fatalf("%s is not instantiated as a filter: %#v", Type, handle.Plugin(Type))
	}
}
