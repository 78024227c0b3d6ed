// Package contexttier is the m3fleet-context-tier filter of m3fleet's endpoint picker: a fleet may serve one model
// from several pools that differ by context length (a short-context tier with many sequences per replica, a
// 1M-token tier), and a request belongs on the smallest tier whose context fits its prompt. Upstream GIE v1.3.0
// has no prompt-length filter, so this one is compiled into our EPP build next to the upstream plugins.
//
// Every serving pod of a gatewayed fleet carries the label m3fleet.dev/max-context-tokens with its tier's maximum
// context in tokens; the operator sets it, this filter reads it.
package contexttier

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/plugins"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/framework"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling/types"
)

const (
	// Type is the plugin type name used in the EndpointPickerConfig (fixed with the operator).
	Type = "m3fleet-context-tier"
	// DefaultLabel is the pod label that holds a tier's maximum context in tokens (fixed with the operator).
	DefaultLabel = "m3fleet.dev/max-context-tokens"
	// DefaultBytesPerToken is the estimate's divisor. Tokenizers of M3's family average about 4 bytes of
	// UTF-8 per token on English prose, 3-4 on code and on CJK text (3 bytes a character, about one token
	// each); 3 over-estimates rather than under-estimates, because an under-estimate sends a prompt to a tier
	// that must refuse it, while an over-estimate only sends a prompt near a boundary to the larger tier.
	DefaultBytesPerToken = 3.0
	// messageOverheadTokens counts the chat template's role markers and separators around each message.
	messageOverheadTokens = 8
)

// Parameters are the plugin's optional settings in the EndpointPickerConfig.
type Parameters struct {
	// BytesPerToken divides the prompt's UTF-8 length to estimate its tokens.
	BytesPerToken float64 `json:"bytesPerToken,omitempty"`
	// Label names the pod label holding the tier's maximum context in tokens.
	Label string `json:"label,omitempty"`
}

var _ framework.Filter = &Filter{}

// Filter keeps the endpoints of the smallest context tier that fits the request's estimated prompt.
type Filter struct {
	typedName     plugins.TypedName
	bytesPerToken float64
	label         string
}

// Factory builds the filter from its EndpointPickerConfig entry; registered under Type.
func Factory(name string, rawParameters json.RawMessage, _ plugins.Handle) (plugins.Plugin, error) {
	parameters := Parameters{}
	if len(rawParameters) > 0 {
		decoder := json.NewDecoder(bytes.NewReader(rawParameters))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(&parameters); err != nil {
			return nil, fmt.Errorf("%s parameters: %w (known: bytesPerToken, label)", Type, err)
		}
	}
	filter, err := New(parameters)
	if err != nil {
		return nil, err
	}
	filter.typedName.Name = name
	return filter, nil
}

// New builds the filter, applying the defaults to unset parameters.
func New(parameters Parameters) (*Filter, error) {
	if parameters.BytesPerToken == 0 {
		parameters.BytesPerToken = DefaultBytesPerToken
	}
	if parameters.BytesPerToken < 0 || math.IsNaN(parameters.BytesPerToken) || math.IsInf(parameters.BytesPerToken, 0) {
		return nil, fmt.Errorf("%s parameters: bytesPerToken must be a positive number, got %v", Type, parameters.BytesPerToken)
	}
	if parameters.Label == "" {
		parameters.Label = DefaultLabel
	}
	return &Filter{
		typedName:     plugins.TypedName{Type: Type, Name: Type},
		bytesPerToken: parameters.BytesPerToken,
		label:         parameters.Label,
	}, nil
}

// TypedName returns the type and name of this plugin instance.
func (f *Filter) TypedName() plugins.TypedName {
	return f.typedName
}

// Filter keeps the pods of the smallest tier whose maximum context holds the estimated prompt. When no tier is
// large enough it keeps the largest tier: the estimate is approximate, and that tier's engine gives the
// definitive answer. Pods without a valid label are dropped when labelled pods exist; when none is labelled the
// fleet has no tiers and every pod is kept. It never empties a non-empty list.
func (f *Filter) Filter(ctx context.Context, _ *types.CycleState, request *types.LLMRequest, pods []types.Pod) []types.Pod {
	tiers := groupByTier(pods, f.label)
	if len(tiers) == 0 {
		return pods
	}
	limits := make([]int64, 0, len(tiers))
	for limit := range tiers {
		limits = append(limits, limit)
	}
	sort.Slice(limits, func(i, j int) bool { return limits[i] < limits[j] })

	promptTokens := f.EstimateTokens(request)
	chosen := limits[len(limits)-1]
	for _, limit := range limits {
		if promptTokens <= limit {
			chosen = limit
			break
		}
	}
	log.FromContext(ctx).V(4).Info("context tier chosen", "plugin", f.typedName.String(),
		"estimatedPromptTokens", promptTokens, "tierMaxContextTokens", chosen, "tiers", limits)
	return tiers[chosen]
}

// groupByTier maps each tier's maximum context to its pods; pods without a valid label are left out.
func groupByTier(pods []types.Pod, label string) map[int64][]types.Pod {
	tiers := map[int64][]types.Pod{}
	for _, pod := range pods {
		if pod == nil || pod.GetPod() == nil {
			continue
		}
		limit, err := strconv.ParseInt(pod.GetPod().Labels[label], 10, 64)
		if err != nil || limit <= 0 {
			continue
		}
		tiers[limit] = append(tiers[limit], pod)
	}
	return tiers
}

// EstimateTokens estimates the prompt's tokens from the parsed request body without a tokenizer (the EPP has
// none for M3, and tokenizing a 1M-token prompt per request would cost more than routing it): the UTF-8 length
// of the text the engine will tokenize (chat messages, tools and documents, or the completion prompt) divided
// by bytesPerToken, plus the chat template's per-message overhead, rounded up.
func (f *Filter) EstimateTokens(request *types.LLMRequest) int64 {
	if request == nil || request.Body == nil {
		return 0
	}
	var promptBytes, overheadTokens int
	if chat := request.Body.ChatCompletions; chat != nil {
		for _, message := range chat.Messages {
			promptBytes += len(message.Role) + len(message.Content.PlainText())
			overheadTokens += messageOverheadTokens
		}
		promptBytes += jsonLength(chat.Tools) + jsonLength(chat.Documents)
	} else if completion := request.Body.Completions; completion != nil {
		promptBytes = len(completion.Prompt)
	}
	return int64(math.Ceil(float64(promptBytes)/f.bytesPerToken)) + int64(overheadTokens)
}

// jsonLength is the length of a value as the engine receives it (JSON), 0 when absent.
func jsonLength(value []any) int {
	if len(value) == 0 {
		return 0
	}
	encoded, err := json.Marshal(value)
	if err != nil {
		return 0
	}
	return len(encoded)
}
