"""The speaker encoder: resemblyzer's embeddings in onnxruntime and in numpy, its weights read
without torch, its LSTM graph prepared once, and a missing model said in one paragraph."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from overnight.workers.diarize.encoder import (
    ENGINES,
    LSTM_GRAPH_VERSION,
    SpeakerEncoder,
    graph_version,
    lstm_graph,
    mel_filterbank,
    mel_frames,
)
from overnight.workers.diarize.prepare import (
    PREPARE_COMMAND,
    DiarizerModelMissing,
    default_cache_root,
    encoder_path,
    load_weights,
    lstm_path,
    prepare_encoder,
    prepare_lstm_graph,
)
from overnight.workers.whisper_models import ModelLoadError
from tests.conftest import SHARED_DATA, loaded_by


def _installed_checkpoint() -> Path | None:
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def diarizer_model_dir(tmp_path_factory) -> Path:
    """The prepared encoder's folder: overnight's model cache, else a copy prepared here from
    an installed resemblyzer package (never a download in a test)."""
    try:
        load_weights()
    except DiarizerModelMissing:
        source = _installed_checkpoint()
        if source is None:
            pytest.skip("no prepared speaker model and no resemblyzer package to prepare it from")
        return prepare_encoder(source, tmp_path_factory.mktemp("model")).parent
    if graph_version(lstm_path()) == LSTM_GRAPH_VERSION:
        return default_cache_root()
    # Weights prepared before the graph was: a copy gains it here (the install prepares it).
    copy = tmp_path_factory.mktemp("model")
    shutil.copy(encoder_path(), copy)
    prepare_lstm_graph(copy)
    return copy


def _weights_only_copy(model_dir: Path, folder: Path) -> Path:
    """A model cache with the prepared weights and no graph, as an install before it left."""
    shutil.copy(encoder_path(model_dir), folder)
    return folder


@pytest.fixture(scope="module", params=ENGINES)
def encoder(request, diarizer_model_dir) -> SpeakerEncoder:
    return SpeakerEncoder.load(diarizer_model_dir, engine=request.param)


def _speech() -> np.ndarray:
    path = SHARED_DATA / "audio" / "1089-134686-0001.wav"
    if path.is_file():
        from faster_whisper.audio import decode_audio

        return decode_audio(str(path), sampling_rate=16_000)
    from overnight.jobs.ops.demo import speak

    return speak("The horizon seems extremely distant, said the wizard.", voice="en-gb+m3")


def test_embeddings_equal_resemblyzers_voice_encoder_to_1e_4(encoder):
    torch = pytest.importorskip("torch")
    pytest.importorskip("librosa")
    pytest.importorskip("webrtcvad")
    resemblyzer = pytest.importorskip("resemblyzer")
    wav = resemblyzer.preprocess_wav(_speech(), 16_000)
    theirs = resemblyzer.VoiceEncoder(device="cpu", verbose=False)
    np.testing.assert_allclose(encoder.embed_utterance(wav), theirs.embed_utterance(wav), atol=1e-4)
    # The network alone, on a batch of partials of their own front end.
    mels = resemblyzer.wav_to_mel_spectrogram(wav)
    batch = np.stack([mels[i : i + 160] for i in (0, 80, 160)])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(encoder.embed(batch), expected, atol=1e-4)


def test_onnxruntime_and_numpy_engines_give_the_same_embeddings_on_speech(diarizer_model_dir):
    weights = load_weights(diarizer_model_dir)
    fast, reference = SpeakerEncoder(weights), SpeakerEncoder(weights, engine="numpy")
    assert fast.engine == "onnxruntime"  # the default
    mels = mel_frames(_speech())
    # Windows of the diarizer's lengths (1.2 s every 0.4 s, and a short region's 0.5 s).
    for frames in (120, 50):
        batch = np.stack([mels[s : s + frames] for s in range(0, len(mels) - frames, 40)])
        np.testing.assert_allclose(fast.embed(batch), reference.embed(batch), atol=1e-5)


def test_an_unknown_engine_is_refused_with_the_choices(diarizer_model_dir):
    with pytest.raises(ValueError, match="onnxruntime, numpy"):
        SpeakerEncoder(load_weights(diarizer_model_dir), engine="torch")  # type: ignore[arg-type]


def test_mel_front_end_equals_librosas_slaney_filterbank_and_frames():
    librosa = pytest.importorskip("librosa")
    np.testing.assert_allclose(
        mel_filterbank(), librosa.filters.mel(sr=16_000, n_fft=400, n_mels=40), atol=1e-7
    )
    wav = _speech()[:32_000]
    theirs = librosa.feature.melspectrogram(y=wav, sr=16_000, n_fft=400, hop_length=160, n_mels=40)
    ours = mel_frames(wav)
    assert ours.shape == theirs.T.shape
    np.testing.assert_allclose(ours, theirs.T, rtol=1e-3, atol=1e-5 * float(theirs.max()))


def test_encoder_runs_without_torch_in_a_fresh_interpreter(diarizer_model_dir):
    code = (
        "import numpy as np\n"
        "from overnight.workers.diarize import Diarizer\n"
        "from overnight.workers.diarize.encoder import SpeakerEncoder\n"
        f"enc = SpeakerEncoder.load({str(diarizer_model_dir)!r})\n"
        "Diarizer(encoder=enc)(np.random.default_rng(0).standard_normal(48000).astype('f4'))"
    )
    # Nor onnx: the prepared graph is loaded as it is (importing onnx costs each process
    # 0.6-0.7 s, most of it its ml_dtypes dependency).
    heavy = ["torch", "scipy", "sklearn", "librosa", "onnx", "ml_dtypes"]
    assert loaded_by(code, heavy) == []


def test_prepared_lstm_graph_is_the_graph_the_weights_build(diarizer_model_dir):
    assert lstm_path(diarizer_model_dir).read_bytes() == lstm_graph(
        load_weights(diarizer_model_dir)
    )
    assert graph_version(lstm_path(diarizer_model_dir)) == LSTM_GRAPH_VERSION


def test_a_cache_prepared_before_the_graph_gains_it_on_the_next_prepare(
    diarizer_model_dir, tmp_path
):
    folder = _weights_only_copy(diarizer_model_dir, tmp_path)
    assert not lstm_path(folder).exists()
    prepare_encoder(cache_dir=folder)  # no source needed: the weights are there
    assert lstm_path(folder).read_bytes() == lstm_path(diarizer_model_dir).read_bytes()


@pytest.mark.parametrize("damage", ["missing", "garbage", "other version"])
def test_a_missing_damaged_or_stale_graph_is_built_from_the_weights_instead(
    diarizer_model_dir, tmp_path, damage
):
    folder = _weights_only_copy(diarizer_model_dir, tmp_path)
    graph = lstm_path(folder)
    if damage == "garbage":
        graph.write_bytes(b"not a model")
    elif damage == "other version":
        # Another version's graph, with other weights: were it used, the embeddings would differ.
        onnx = pytest.importorskip("onnx")
        from onnx import numpy_helper

        model = onnx.load_from_string(lstm_graph(load_weights(folder)))
        first = model.graph.initializer[0]
        first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 0, first.name))
        for prop in model.metadata_props:
            prop.value = str(LSTM_GRAPH_VERSION + 1)
        graph.write_bytes(model.SerializeToString())
    batch = np.stack([mel_frames(_speech())[s : s + 120] for s in (0, 40, 80)])
    expected = SpeakerEncoder.load(diarizer_model_dir).embed(batch)
    np.testing.assert_array_equal(SpeakerEncoder.load(folder).embed(batch), expected)
    prepare_lstm_graph(folder)  # and the next preparation writes it again
    assert graph_version(graph) == LSTM_GRAPH_VERSION


def test_prepared_weights_equal_the_checkpoints_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    source = _installed_checkpoint()
    if source is None:
        pytest.skip("resemblyzer is not installed (EXTRAS=dev installs it)")
    weights = load_weights(prepare_encoder(source, tmp_path).parent)
    state = torch.load(source, map_location="cpu", weights_only=False)["model_state"]
    for name, value in weights.items():
        np.testing.assert_array_equal(value, state[name].numpy())


def test_missing_model_is_a_model_error_of_one_paragraph_naming_the_prepare_command(tmp_path):
    with pytest.raises(DiarizerModelMissing) as caught:
        load_weights(tmp_path)
    message = str(caught.value)
    assert isinstance(caught.value, ModelLoadError)  # the job's exit 5
    assert "\n" not in message
    assert PREPARE_COMMAND in message and str(tmp_path) in message
