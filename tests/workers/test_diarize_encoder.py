"""The speaker encoder: resemblyzer's embeddings in onnxruntime and in numpy, its weights read
without torch, and a missing model said in one paragraph."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from overnight.workers.diarize.encoder import (
    ENGINES,
    SpeakerEncoder,
    mel_filterbank,
    mel_frames,
)
from overnight.workers.diarize.prepare import (
    PREPARE_COMMAND,
    DiarizerModelMissing,
    default_cache_root,
    load_weights,
    prepare_encoder,
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
    return default_cache_root()


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
    assert loaded_by(code, ["torch", "scipy", "sklearn", "librosa"]) == []


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
